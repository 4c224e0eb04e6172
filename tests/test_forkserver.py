"""The session fork server: nested spawns and `wait` run forked from it, with the same results as without it.

End to end with the real CLI and the scripted model. The root's first Bash
step waits for the server's socket, so that the nested spawns find it (a
spawn that comes before it takes the normal path, which is also correct but
not what these tests are about).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest
from conftest import (
    agent_dirs,
    listen_unix,
    load,
    metas,
    mock_task,
    run_python,
    run_spawn,
    spawn_in_bash,
    start_spawn,
    stdout_json,
    wait_for_path,
    wait_until_gone,
)

import spawn

SOCKET = '"$SPAWN_SESSION/forkserver.sock"'
# Skipped when the server is off: nothing would ever listen there.
WAIT_FOR_SOCKET = (
    f'[ "$SPAWN_NO_FORKSERVER" = 1 ] || {{ for i in $(seq 600); do [ -S {SOCKET} ] && break; sleep 0.05; done; stat -c %a {SOCKET}; }}'
)


def forks(session_root: Path) -> list[dict[str, Any]]:
    """The fork server's record of what it forked (empty if it forked nothing)."""
    lines = []
    for log in session_root.glob(f"*/{spawn.FORKSERVER_LOG}"):
        lines += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return lines


def servers(session_root: Path) -> list[psutil.Process]:
    """Fork server processes of sessions under session_root (each logs its pid as it starts)."""
    found = []
    for log in session_root.glob("*/forkserver.log"):
        for line in log.read_text().splitlines():
            if line.startswith("spawn.py fork server "):
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(int(line.split()[-1]))
                    if proc.name() == spawn.FORKSERVER_NAME:
                        found.append(proc)
    return found


def log_text(session_root: Path) -> str:
    """What the sessions' fork servers wrote to their logs."""
    return "".join(log.read_text() for log in session_root.glob("*/forkserver.log"))


def chain(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    leaf = mock_task("leaf level", [{"text": "leaf-result"}])
    middle = mock_task("middle level", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Read")}, {"text": "middle-result"}])
    root = mock_task(
        "root level",
        [{"bash": WAIT_FOR_SOCKET}, {"bash": spawn_in_bash("--task", middle, "--tools", "Bash,Read")}, {"text": "root-result"}],
    )
    return run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "3"], env)


def outcomes(session_root: Path) -> dict[int, tuple[str, Any]]:
    return {
        load(d / "meta.json")["depth"]: (load(d / "outcome.json")["status"], load(d / "outcome.json")["output"])
        for d in agent_dirs(session_root)
    }


def test_nested_chain_runs_through_the_fork_server(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    proc = chain(env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["output"] == "root-result"
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    # Both nested levels were forked by the server: their runners are its children.
    schema = json.loads((spawn.SCHEMA_DIR / "forkserver-line.json").read_text())
    for line in forks(session_root):
        jsonschema.validate(line, schema)
    forked = {line["pid"] for line in forks(session_root)}
    assert {by_depth[1]["pid"], by_depth[2]["pid"]} <= forked
    assert by_depth[2]["parent_id"] == by_depth[1]["id"] and by_depth[1]["parent_id"] == by_depth[0]["id"]
    # The root's Bash saw the socket, private to the user.
    (root_dir,) = [d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 0]
    assert '"600' in (root_dir / "transcript.jsonl").read_text()
    # The server ended with the root, and took its socket with it.
    assert not wait_until_gone([p.pid for p in servers(session_root)], timeout=30)
    assert not list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))

    # Without the server: the same exit code and outcomes, and nothing forked.
    other_root = tmp_path / "no-server"
    plain = chain({**env, "SPAWN_NO_FORKSERVER": "1", "SPAWN_SESSION_ROOT": str(other_root)})
    assert plain.returncode == proc.returncode
    assert outcomes(other_root) == outcomes(session_root)
    assert not forks(other_root) and not list(other_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))


@pytest.mark.parametrize("server_on", [True, False])
def test_depth_limit_holds_through_the_server(env: dict[str, str], session_root: Path, server_on: bool) -> None:
    grandchild = mock_task("too deep", [{"text": "should not run"}])
    child = mock_task(
        "at max depth", [{"bash": spawn_in_bash("--task", grandchild, "--tools", "Read") + "; echo exit=$?"}, {"text": "child-done"}]
    )
    root = mock_task(
        "root",
        # Out of the sandbox (auto would put it in, as it can't spawn): its spawn must reach the server to be refused there.
        [
            {"bash": WAIT_FOR_SOCKET},
            {"bash": spawn_in_bash("--task", child, "--tools", "Bash,Read", "--sandbox", "off")},
            {"text": "root-done"},
        ],
    )
    run_env = env if server_on else {**env, "SPAWN_NO_FORKSERVER": "1"}
    proc = run_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "1"], run_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    by_depth = {load(d / "meta.json")["depth"]: d for d in agent_dirs(session_root)}
    assert load(by_depth[1] / "outcome.json")["status"] == "done"
    # The spawn at depth 2 was refused (exit 4), with or without the server.
    assert f"exit={int(spawn.ExitCode.REFUSED)}" in (by_depth[1] / "transcript.jsonl").read_text()
    if 2 in by_depth:
        assert load(by_depth[2] / "outcome.json")["status"] == "refused"
    stand_ins = [line for line in forks(session_root) if line["verb"] == "run"]
    assert len(stand_ins) == (2 if server_on else 0)  # the child, and the refused spawn below it


def test_sigkill_of_the_stand_in_ends_the_forked_agent(env: dict[str, str], session_root: Path) -> None:
    child = mock_task("slow child", [{"text": "never", "sleep": 300}])
    root = mock_task(
        "root", [{"bash": WAIT_FOR_SOCKET}, {"bash": spawn_in_bash("--task", child, "--tools", "Read")}, {"text": "root-done"}]
    )
    proc = start_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    try:
        limit = time.monotonic() + 90
        while not [line for line in forks(session_root) if line["verb"] == "run"]:
            assert time.monotonic() < limit and proc.poll() is None, "the child was never forked"
            time.sleep(0.05)
        (line,) = forks(session_root)
        child_dir: Path | None = None
        limit = time.monotonic() + 60
        while child_dir is None:
            found = [d for d in agent_dirs(session_root) if (d / "meta.json").exists() and load(d / "meta.json")["depth"] == 1]
            child_dir = found[0] if found else None
            assert time.monotonic() < limit, "the child never registered"
            time.sleep(0.05)
        assert load(child_dir / "meta.json")["pid"] == line["pid"]
        os.kill(line["client_pid"], signal.SIGKILL)
        assert not wait_until_gone([line["pid"]], timeout=60), "the forked agent outlived its stand-in"
        wait_for_path(child_dir / "outcome.json", timeout=60)
        assert load(child_dir / "outcome.json")["status"] in ("failed", "killed")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out.splitlines()[-1])["output"] == "root-done"


@pytest.mark.parametrize("socket_state", ["dead", "garbage"])
def test_a_dead_or_garbage_socket_falls_back_silently(env: dict[str, str], session_root: Path, tmp_path: Path, socket_state: str) -> None:
    go = tmp_path / "go"
    child = mock_task("child", [{"text": "child-result"}])
    # The test itself waits for the socket: the agent only holds until told to go.
    hold = f"while [ ! -e {go} ]; do sleep 0.05; done"
    root = mock_task("root", [{"bash": hold}, {"bash": spawn_in_bash("--task", child, "--tools", "Read")}, {"text": "root-done"}])
    proc = start_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    try:
        limit = time.monotonic() + 90
        while not (sock := list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))):
            assert time.monotonic() < limit and proc.poll() is None, "no fork server socket"
            time.sleep(0.05)
        for server in servers(session_root):
            server.kill()  # SIGKILL: the socket file stays behind, with nobody listening
        assert not wait_until_gone([p.pid for p in servers(session_root)], timeout=30)
        if socket_state == "garbage":
            sock[0].unlink()
            sock[0].write_bytes(b"not a socket\n")
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out.splitlines()[-1])["output"] == "root-done"
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert load(child_dir / "outcome.json")["output"] == "child-result"
    assert not forks(session_root)


def request_as(uid: int, sock: Path, *, new_pid_namespace: bool = False) -> bytes:
    """Connect to a fork server as another user and send a request; what it answers.

    A forked child of the test changes uid (the interpreter under /root may
    be out of that user's reach), and connects through an fd of the socket's
    directory, as the stand-in does: test paths are too long for an address.
    With new_pid_namespace, it connects from a pid namespace of its own, as
    a process in an agent's sandbox would.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe only
        code = 1
        try:
            if new_pid_namespace:
                if ctypes.CDLL(None, use_errno=True).unshare(0x20000000) != 0:  # CLONE_NEWPID: our children's
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
                if (inner := os.fork()) != 0:
                    os._exit(os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1]))
                assert os.getpid() == 1
            os.setgid(uid)
            os.setuid(uid)
            fd = os.open(sock.parent, os.O_PATH | os.O_DIRECTORY)
            client = socket.socket(socket.AF_UNIX)
            client.settimeout(30)
            client.connect(f"/proc/self/fd/{fd}/{sock.name}")
            body = json.dumps({"argv": ["--task", "x"], "env": {}, "cwd": "/", "prefix": sys.prefix, "script": ["", 0, 0]}).encode()
            try:
                socket.send_fds(client, [len(body).to_bytes(4, "big") + body], [0, 1, 2])
                answer = client.recv(1000)
            except (BrokenPipeError, ConnectionResetError):
                answer = b""  # closed before or after our request, unread: refused as well
            os.write(write_end, b"answer:" + answer)
            code = 0
        except BaseException as exc:
            os.write(write_end, f"error: {exc!r}".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        reported = fh.read()
    os.waitpid(pid, 0)
    assert reported.startswith(b"answer:"), reported
    return reported.removeprefix(b"answer:")


@contextlib.contextmanager
def root_holding_its_server(env: dict[str, str], session_root: Path, tmp_path: Path) -> Iterator[Path]:
    """A root whose Bash waits while its fork server listens: the server's socket.

    On leaving, the root is let go and must finish done.
    """
    go = tmp_path / "go"
    root = mock_task("root", [{"bash": f"{WAIT_FOR_SOCKET}; while [ ! -e {go} ]; do sleep 0.05; done"}, {"text": "root-done"}])
    proc = start_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    try:
        limit = time.monotonic() + 90
        while not (sock := list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))):
            assert time.monotonic() < limit and proc.poll() is None, "no fork server socket"
            time.sleep(0.05)
        yield sock[0]
        go.touch()
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace of its own needs root")
def test_a_client_from_another_pid_namespace_is_refused(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # A process in an agent's sandbox: whatever it sends, what it spawns must stay in there.
    with root_holding_its_server(env, session_root, tmp_path) as sock:
        assert request_as(os.getuid(), sock, new_pid_namespace=True) == b""  # closed unanswered
        assert not forks(session_root)
        assert request_as(os.getuid(), sock) != b""  # the same request from here is answered


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another uid needs root")
def test_the_socket_is_private_and_another_uid_is_refused(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    with root_holding_its_server(env, session_root, tmp_path) as sock:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        # Past the file mode (opened up here on purpose), the server checks the peer's uid itself.
        opened: list[tuple[Path, int]] = []
        try:
            sock.chmod(0o777)
            for folder in [p for p in sock.parents if p != Path("/")]:
                mode = stat.S_IMODE(folder.stat().st_mode)
                opened.append((folder, mode))
                folder.chmod(mode | 0o001)
            assert request_as(65534, sock) == b""  # closed unanswered: that client takes the normal path
            assert not forks(session_root)
        finally:
            for folder, mode in opened:
                folder.chmod(mode)


def still_serving(sock: Path, payload: bytes) -> bool:
    """Whether the server answers a well-formed request with a refusal. (A server slow to look still
    serves a request that is whole by its deadline: it reads what has come before it drops a client.)"""
    return b"refused" in send_raw(sock, payload)


def open_fds(pid: int) -> dict[int, str]:
    """What each of a process's fds points to; one it closes between the listing and the look is left out."""
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            fds[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return fds


def send_raw(sock: Path, payload: bytes) -> bytes:
    """Send bytes (with our stdio fds) to a fork server as this process; what it answers before closing."""
    fd = os.open(sock.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(30)
            client.connect(f"/proc/self/fd/{fd}/{sock.name}")
            try:
                sent = socket.send_fds(client, [payload], [0, 1, 2])
                if sent < len(payload):  # a long payload goes in more than one send
                    client.sendall(payload[sent:])
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before all of it went: what it answered, if anything, is still there to read
            # Never an empty send, as spawn.py's own client (forkserver_request): a server that
            # has the whole request may reply and close first, and a send to it then fails (EPIPE).
            # Under load that made a refusal look like a request closed unanswered.
            try:
                return client.recv(1000)
            except ConnectionResetError:
                return b""
    finally:
        os.close(fd)


def test_the_server_outlives_malformed_requests(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    good = {"argv": ["--task", "x"], "env": {}, "cwd": "/", "prefix": sys.prefix, "script": ["", 0, 0]}
    bad: list[object] = [[], {**good, "argv": 5}, {**good, "argv": []}, {**good, "env": ["A=1"]}, {**good, "env": {"A": 1}}]
    bad += [{**good, "script": 7}, {**good, "script": ["", "0", 0]}, {**good, "cwd": None}, {**good, "detach": "yes"}]
    with root_holding_its_server(env, session_root, tmp_path) as sock:
        for request in bad:
            body = json.dumps(request).encode()
            assert send_raw(sock, len(body).to_bytes(4, "big") + body) == b"", request  # closed unanswered
        assert send_raw(sock, b"\xff\xff\xff\xff{") == b""  # a length no request has
        assert send_raw(sock, b"\x00\x00\x00\x05{nope") == b""
        assert not forks(session_root)
        body = json.dumps(good).encode()
        assert still_serving(sock, len(body).to_bytes(4, "big") + body)  # the reply refuses it: not our script
        assert servers(session_root)


def test_request_problem_names_the_malformed_field() -> None:
    good = {"argv": ["_run", "/d"], "env": {"A": "1"}, "cwd": "/", "prefix": "/p", "script": ["/s", 1, 2], "detach": True}
    assert spawn.request_problem(good) is None
    assert spawn.request_problem([good]) == "not an object"
    assert spawn.request_problem({**good, "argv": ["a", 1]}) == "argv"
    assert spawn.request_problem({**good, "env": {"A": None}}) == "env"
    assert spawn.request_problem({**good, "prefix": 1}) == "cwd or prefix"
    assert spawn.request_problem({**good, "script": ["/s", True, 2]}) == "script"
    assert spawn.request_problem({**good, "detach": 1}) == "detach or child_of"
    assert spawn.request_problem({**good, "child_of": "yes"}) == "detach or child_of"
    assert spawn.request_problem({**good, "child_of": True}) is None


def test_a_request_the_server_answered_is_served_however_late_the_client_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit level, against a stand-in server: it reads the whole request, forks (here: answers a pid)
    and closes before the client has returned from sending. The client must take the answer, or
    its caller runs the spawn again on the normal path (a background agent's runner ran twice)."""
    import _socket  # what forkserver_request uses

    session = tmp_path / "s"
    session.mkdir()
    closed = threading.Event()
    listener = listen_unix(session / spawn.FORKSERVER_SOCKET)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
            for fd in fds:
                os.close(fd)
            body = data[4:]
            while len(body) < int.from_bytes(data[:4], "big"):
                body += conn.recv(1 << 16)
            assert json.loads(body)["argv"] == ["_run", "/d"]
            conn.sendall(b'{"pid": 4242}\n')
        closed.set()

    class SlowClient(_socket.socket):
        def sendmsg(self, *args: Any) -> int:
            sent: int = super().sendmsg(*args)
            closed.wait(10)  # as a client on a loaded machine: the server is done before it goes on
            return sent

    monkeypatch.setattr(_socket, "socket", SlowClient)
    server = threading.Thread(target=serve)
    server.start()
    try:
        request: dict[str, object] = {"argv": ["_run", "/d"], "env": {}, "cwd": "/", "prefix": sys.prefix, "script": ["", 0, 0]}
        served = spawn.forkserver_request(str(session), request, (0, 1, 2))
    finally:
        server.join(10)
        listener.close()
    assert served is not None, "answered, yet taken as not served"
    served[0].close()
    assert served[1:] == (4242, b"")


def test_stand_in_takes_the_normal_path_without_a_server(tmp_path: Path) -> None:
    """Unit level: no session, no socket, a verb, or SPAWN_NO_FORKSERVER=1: None (the normal path)."""
    session = tmp_path / "s"
    session.mkdir()
    environ = {"SPAWN_SESSION": str(session)}
    assert spawn.forkserver_stand_in(["--task", "x"], {}) is None
    assert spawn.forkserver_stand_in(["--task", "x"], environ) is None  # no socket
    (session / spawn.FORKSERVER_SOCKET).write_text("garbage")
    assert spawn.forkserver_stand_in(["--task", "x"], environ) is None
    assert spawn.forkserver_stand_in(["status"], environ) is None
    assert spawn.forkserver_stand_in(["--task", "x"], {**environ, "SPAWN_NO_FORKSERVER": "1"}) is None


def test_a_background_agent_runs_forked_and_kill_reaches_it(env: dict[str, str], session_root: Path) -> None:
    """A background agent's runner is forked too, detached at its forked launcher's request: `kill` signals it (meta.json's pid)."""
    child = mock_task("slow background child", [{"text": "never", "sleep": 300}])
    launch = spawn_in_bash("--task", child, "--tools", "Read", "--background", "--print", "id")
    root = mock_task(
        "root",
        [{"bash": f"{WAIT_FOR_SOCKET}; id=$({launch}); {spawn_in_bash('wait')} $id > /dev/null; echo waited=$?"}, {"text": "root-done"}],
    )
    proc = start_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    try:
        limit = time.monotonic() + 90
        while not (runs := [line for line in forks(session_root) if line["verb"] == "_run"]):
            assert time.monotonic() < limit and proc.poll() is None, "the background runner was never forked"
            time.sleep(0.05)
        # A background agent's meta.json is its runner's to write: it may come just after the fork's line.
        (child_dir,) = [d for d in agent_dirs(session_root) if d.name.startswith("a1-")]
        wait_for_path(child_dir / "meta.json")
        assert runs[0].get("detached") is True  # no stand-in: the launcher was forked too, and asked for it
        assert load(child_dir / "meta.json")["pid"] == runs[0]["pid"]
        killed = run_spawn(["kill", child_dir.name, "--session", str(child_dir.parent.parent)], env)
        assert killed.returncode == spawn.ExitCode.OK, killed.stderr
        assert load(child_dir / "outcome.json")["status"] == "killed"
        assert not wait_until_gone([runs[0]["pid"], runs[0]["client_pid"]], timeout=60)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out.splitlines()[-1])["output"] == "root-done"


def test_the_server_is_the_roots_fork_and_holds_nothing_of_the_roots(env: dict[str, str], session_root: Path) -> None:
    """Forked from the root: in its cgroup, with none of its descriptors, and gone the moment a SIGKILLed root is."""
    root = mock_task("root", [{"bash": WAIT_FOR_SOCKET}, {"text": "never", "sleep": 300}])
    proc = start_spawn(["--task", root, "--tools", "Bash,Read", "--max-depth", "2"], env)
    try:
        limit = time.monotonic() + 90
        while not servers(session_root):
            assert time.monotonic() < limit and proc.poll() is None, "no fork server"
            time.sleep(0.05)
        (server,) = servers(session_root)
        (root_dir,) = agent_dirs(session_root)
        runner = psutil.Process(load(root_dir / "meta.json")["pid"])
        assert server.ppid() == runner.pid and server.name() == spawn.FORKSERVER_NAME
        assert server.cwd() == runner.cwd()
        # Its own session; stdin /dev/null, stdout and stderr its log; else only its socket.
        assert os.getsid(server.pid) == server.pid
        log = str(session_root.glob("*/forkserver.log").__next__())
        # An fd of the root's would stay open for good. The server's own come
        # and go while it works (its socket's directory while it binds a long
        # path, a library while it loads, /proc while it looks at the root):
        # it passes once a look finds none of those.
        # Its own: its socket, and the one epoll its selector reads clients with (made after
        # it closed every fd of the root's; the root's event loop's would be a second one).
        limit = time.monotonic() + 30

        def only_its_own(fds: dict[int, str]) -> bool:
            polls = [t for t in fds.values() if t == "anon_inode:[eventpoll]"]
            return len(polls) <= 1 and all(t.startswith("socket:") for t in fds.values() if t not in polls)

        while True:
            fds = open_fds(server.pid)
            assert fds.pop(0) == os.devnull and fds.pop(1) == log and fds.pop(2) == log
            if only_its_own(fds) or time.monotonic() > limit:
                break
            time.sleep(0.01)
        assert only_its_own(fds), fds
        assert Path(f"/proc/{server.pid}/cgroup").read_text() == Path(f"/proc/{runner.pid}/cgroup").read_text()
        runner.kill()
        # Gone by the parent-death signal, not by its once-a-second look at
        # the root (which would log that the root is gone): no clock to race.
        assert not wait_until_gone([server.pid], timeout=30)
        assert "its root is gone" not in log_text(session_root), log_text(session_root)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # The guard settles the root (after the runner is gone); the socket went with the server.
    wait_for_path(root_dir / "outcome.json")
    assert load(root_dir / "outcome.json")["status"] in ("killed", "failed")
    limit = time.monotonic() + 30  # the guard ends the tree's cgroup after it commits the outcome
    while list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}")):
        assert time.monotonic() < limit, "the socket outlived the tree"
        time.sleep(0.05)


def test_a_server_whose_root_is_gone_stops_by_its_own_look(env: dict[str, str], session_root: Path) -> None:
    # The look that backs up the death signal (which a root dying between its
    # fork and the server's prctl would miss): a server for a finished root
    # stops at once, says why, and takes its socket.
    proc = run_spawn(["--task", mock_task("root", [{"text": "done"}]), "--tools", "Read"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    (root_dir,) = agent_dirs(session_root)
    serve = "import sys, pathlib, spawn; spawn.serve_forks(spawn.load_meta(pathlib.Path(sys.argv[1])), spawn.main)"
    done = run_python(["-c", serve, str(root_dir)], env, cwd=spawn.SCRIPT_PATH.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(": its root is gone\n"), done.stdout
    assert not list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))


def test_a_deep_request_is_refused_and_the_server_serves_on(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # Issue 31, item 10: one 200k-deep request ended the server (RecursionError in its loop).
    with root_holding_its_server(env, session_root, tmp_path) as sock:
        deep = b"[" * 200_000 + b"]" * 200_000
        assert send_raw(sock, len(deep).to_bytes(4, "big") + deep) == b""  # closed unanswered
        assert servers(session_root)
        good = json.dumps({"argv": ["--task", "x"], "env": {}, "cwd": "/", "prefix": sys.prefix, "script": ["", 0, 0]}).encode()
        assert still_serving(sock, len(good).to_bytes(4, "big") + good)  # the reply refuses it: not our script


def test_a_trickling_client_does_not_hold_up_a_nested_spawn(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # Issue 31, item 10: a client sending a byte every few seconds stalled the
    # accept loop, and a nested spawn waited out FORKSERVER_REPLY_S (30 s) and
    # then took the normal path. The slow client here would take 60 s to send
    # its request; the nested spawn must go through the server meanwhile.
    go = tmp_path / "go"
    child = mock_task("child", [{"text": "child-result"}])
    step = f"{WAIT_FOR_SOCKET}; while [ ! -e {go} ]; do sleep 0.05; done; {spawn_in_bash('--task', child)}"
    proc = start_spawn(["--task", mock_task("root", [{"bash": step}, {"text": "root-done"}]), "--tools", "Bash,Read"], env)
    stop = threading.Event()
    answers: list[bytes] = []

    def trickle(sock: Path) -> None:
        fd = os.open(sock.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(f"/proc/self/fd/{fd}/{sock.name}")
                client.sendall((120).to_bytes(4, "big"))
                for _ in range(120):
                    if stop.wait(0.5):
                        break
                    client.sendall(b" ")
                client.settimeout(1)
                answers.append(client.recv(100))
        except OSError:
            answers.append(b"")  # dropped by the server: that is fine too
        finally:
            os.close(fd)

    slow: threading.Thread | None = None
    try:
        limit = time.monotonic() + 90
        while not (sock := list(session_root.glob(f"*/{spawn.FORKSERVER_SOCKET}"))):
            assert time.monotonic() < limit and proc.poll() is None, "no fork server socket"
            time.sleep(0.05)
        slow = threading.Thread(target=trickle, args=(sock[0],), daemon=True)
        slow.start()
        time.sleep(0.5)  # the server has the slow client's first bytes
        started = time.monotonic()
        go.touch()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == spawn.ExitCode.OK, err
    assert json.loads(out.splitlines()[-1])["output"] == "root-done"
    assert [f["verb"] for f in forks(session_root)] == ["run"]  # the child went through the server
    assert took < 25, took  # not FORKSERVER_REPLY_S and a normal start after it
    child_dir = next(d for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 1)
    assert load(child_dir / "outcome.json")["output"] == "child-result"
    if slow is not None:
        slow.join(10)


# ------------------------------------------------------------ a forked wait --

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
