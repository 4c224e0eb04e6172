"""spawn.py's side of a Ray placement, without Ray: a fake placement service plays tools/ray_place.py serve.

The fake does what the sibling's contract says (sessions/README.md and docs/cluster.md):
started as `serve --address A --record R`, it writes R ({pid, socket}) once it listens;
for each request it answers {"taken": true}, starts a token (a process in a group of its
own), runs spawn.py's own runner with SPAWN_RAY_STANDIN set to the token's pid, as a host
actor would on a node, and answers where the agent runs. The agent is real (the bundled
CLI against the scripted model); only Ray is left out. The cluster itself is tested by
`uvx nox -s ray` (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from conftest import agent_dirs, load, mock_task, run_spawn, spawn_in_bash, wait_until, wait_until_gone

import spawn

SERVICE = r"""
import json, os, socket, subprocess, sys, tempfile, threading, time
args = sys.argv[1:]
record = args[args.index("--record") + 1]
log = os.environ.get("SERVICE_LOG")
if log:
    open(log, "a").write(json.dumps({"pid": os.getpid(), "argv": args, "started": time.time()}) + "\n")
folder = tempfile.mkdtemp(prefix="fake-place-")
path = os.path.join(folder, "place.sock")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(16)
open(record + ".tmp", "w").write(json.dumps({"pid": os.getpid(), "socket": path}))
os.replace(record + ".tmp", record)
boot = open("/proc/sys/kernel/random/boot_id").read().strip()

def serve(conn):
    request = json.loads(conn.makefile("rb").readline())
    if os.environ.get("REQUESTS_LOG"):
        open(os.environ["REQUESTS_LOG"], "a").write(json.dumps({"request": request, "at": time.time()}) + "\n")
    conn.sendall(b'{"taken": true}\n')
    if os.environ.get("NEVER_ANSWER"):
        time.sleep(600)
    agent_dir = request["agent_dir"]
    token = subprocess.Popen(["sleep", "600"], start_new_session=True)
    open(os.environ["TOKEN_PID_FILE"], "w").write(str(token.pid))
    where = {"backend": "ray", "node_id": "node-under-test", "host": "node-host", "boot_id": "b", "pid": token.pid}
    if os.environ.get("LAST_WORD"):  # as ray_place.py does when its node is lost: no runner, a word, the token ends
        conn.sendall((json.dumps(where) + "\n").encode())
        conn.close()
        while not os.path.exists(os.path.join(agent_dir, "meta.json")):
            time.sleep(0.02)
        word = {"exit_code": 1, "reason": os.environ["LAST_WORD"], "pid": os.getpid()}
        open(os.path.join(agent_dir, "standin-exit.json"), "w").write(json.dumps(word))
        token.kill()
        token.wait()
        return
    if os.environ.get("STRANDED"):  # placed, and nothing runs: the token is killed by the test
        conn.sendall((json.dumps(where) + "\n").encode())
        conn.close()
        token.wait()
        return
    where |= {"host": os.uname().nodename, "boot_id": boot}
    env = {**request["environ"], "SPAWN_RAY_STANDIN": str(token.pid)}
    runner = subprocess.Popen([*request["spawn"], "_run", agent_dir], env=env, start_new_session=True)
    conn.sendall((json.dumps(where) + "\n").encode())
    conn.close()
    runner.wait()
    token.kill()
    token.wait()

while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def placed_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    service = tmp_path / "ray_place.py"
    service.write_text(SERVICE)
    placed = {"SPAWN_PLACEMENT": "ray:10.0.0.1:6379", "SPAWN_RAY_SIBLING": str(service), "SPAWN_RAY_PYTHON": sys.executable}
    return {**env, **placed, "TOKEN_PID_FILE": str(tmp_path / "token.pid"), "SERVICE_LOG": str(tmp_path / "services.jsonl")}


def services_started(tmp_path: Path) -> list[dict[str, object]]:
    log = tmp_path / "services.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def end_services(tmp_path: Path) -> None:
    for started in services_started(tmp_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(str(started["pid"])), signal.SIGKILL)


def test_a_placed_agent_runs_under_its_token_and_records_its_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    try:
        proc = run_spawn(["--task", mock_task("placed", [{"text": "from the node"}]), "--tools", "Read"], placed_env(env, tmp_path))
        assert proc.returncode == spawn.ExitCode.OK, proc.stderr
        result = json.loads(proc.stdout)  # one JSON object: nothing of the service's reaches it
        assert result["status"] == "done" and result["output"] == "from the node"
        (agent_dir,) = agent_dirs(session_root)
        meta = load(agent_dir / "meta.json")
        assert meta["placement"]["backend"] == "ray" and meta["placement"]["node_id"] == "node-under-test"
        assert meta["placement"]["policy"] == "ray:10.0.0.1:6379"
        assert meta["host"] and meta["boot_id"]
        token = int((tmp_path / "token.pid").read_text())
        assert meta["pid"] == token and meta["pgid"] == token  # meta names the token, in its own group, not the runner
        assert load(agent_dir / "outcome.json")["status"] == "done"
        [started] = services_started(tmp_path)
        session = agent_dir.parent.parent
        [record] = (session / "placement").glob("*.json")
        assert load(record)["pid"] == started["pid"]  # the record names the service the launcher started
        assert started["argv"] == ["serve", "--address", "10.0.0.1:6379", "--record", str(record)]
    finally:
        end_services(tmp_path)


def test_the_launchers_of_a_session_share_one_service_and_start_another_when_it_is_gone(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    """One Ray driver per session and host: the root's child's launcher finds the root's service by its record;
    once that service is killed (its record left behind), the next launcher starts a new one."""
    child = mock_task("child", [{"text": "child done"}])
    read_pid = "import glob, json, os; print(json.load(open(glob.glob(os.environ['SPAWN_SESSION'] + '/placement/*.json')[0]))['pid'])"
    kill_service = f'kill -KILL $("$SPAWN_PYTHON" -c "{read_pid}"); sleep 0.5'
    steps = [
        {"bash": spawn_in_bash("--task", child, "--tools", "Read")},
        {"bash": f"{kill_service}; {spawn_in_bash('--task', child, '--tools', 'Read')}"},
        {"text": "root done"},
    ]
    try:
        proc = run_spawn(["--task", mock_task("root", steps), "--tools", "Bash,Read"], placed_env(env, tmp_path))
        assert proc.returncode == spawn.ExitCode.OK, proc.stderr
        dirs = agent_dirs(session_root)
        assert len(dirs) == 3 and all(load(d / "meta.json")["placement"]["backend"] == "ray" for d in dirs)
        assert all(load(d / "outcome.json")["status"] == "done" for d in dirs)
        assert len(services_started(tmp_path)) == 2  # the root's and its first child's, then the second child's
    finally:
        end_services(tmp_path)


def test_a_missing_sibling_is_a_clear_error(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_SIBLING": str(tmp_path / "nowhere.py")}
    proc = run_spawn(["--task", mock_task("nowhere", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
    assert proc.returncode != spawn.ExitCode.OK
    assert proc.stderr.startswith("spawn: error: placement ray:") and "nowhere.py" in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_the_stand_in_variable_does_not_let_a_local_agent_run_twice(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """SPAWN_RAY_STANDIN only matters for a record placed on Ray: a local agent's runner check stands."""
    launched = run_spawn(["--task", mock_task("local", [{"text": "once"}]), "--tools", "Read", "--background"], env)
    assert launched.returncode == spawn.ExitCode.OK, launched.stderr
    agent_dir = Path(json.loads(launched.stdout)["agent_dir"])
    second = run_spawn(["_run", str(agent_dir)], {**env, "SPAWN_RAY_STANDIN": str(load(agent_dir / "meta.json")["pid"])})
    assert second.returncode != spawn.ExitCode.OK
    assert "ran nothing" in second.stderr, second.stderr


SILENT = r"""
import json, os, subprocess, sys, time
open(os.environ["SERVICE_ARGS"], "w").write(json.dumps({"argv": sys.argv[1:], "started": time.time()}))
print("fake: connecting to the cluster", file=sys.stderr, flush=True)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a Ray driver's helpers: same group
open(os.environ["SERVICE_PIDS"], "w").write(json.dumps([os.getpid(), helper.pid]))
time.sleep(600)
"""


def test_a_service_that_never_serves_is_ended_with_its_group_and_its_log_quoted(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    sibling = tmp_path / "silent.py"
    sibling.write_text(SILENT)
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_SIBLING": str(sibling), "SPAWN_RAY_PLACE_TIMEOUT": "4"}
    placed |= {"SERVICE_ARGS": str(tmp_path / "args.json"), "SERVICE_PIDS": str(tmp_path / "pids.json")}
    proc = run_spawn(["--task", mock_task("silent", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("spawn: error: placement ray:10.0.0.1:6379: the session's placement service was not serving in time"), line
    assert "ends: fake: connecting to the cluster" in line, line
    assert wait_until_gone(json.loads((tmp_path / "pids.json").read_text()), 10) == []  # the service and its helper


def test_the_placing_side_is_told_to_give_up_first_and_a_silent_one_is_named(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    """Its deadline (place_by, in the request) comes a quarter before the launcher's own limit."""
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_PLACE_TIMEOUT": "4", "NEVER_ANSWER": "1"}
    placed["REQUESTS_LOG"] = str(tmp_path / "requests.jsonl")
    try:
        asked_at = time.time()
        proc = run_spawn(["--task", mock_task("silent", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
        gave_up = time.time()
        assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith("spawn: error: placement ray:10.0.0.1:6379: the agent was not placed: the placing side said nothing"), line
        [request] = [json.loads(x)["request"] for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
        assert asked_at < request["place_by"] < gave_up - 0.9, (asked_at, request["place_by"], gave_up)
        assert request["asked"]["id"] == Path(request["agent_dir"]).name  # the meta.json to be, for the claim
        assert request["spawn"][0] == sys.executable and request["environ"]["SPAWN_PLACEMENT"] == "ray:10.0.0.1:6379"
    finally:
        end_services(tmp_path)


def stranded(env: dict[str, str], tmp_path: Path, last_word: str | None) -> dict[str, str]:
    """A placed agent whose runner never started: its token killed here, or its service's last word."""
    placed = placed_env(env, tmp_path) | ({"LAST_WORD": last_word} if last_word else {"STRANDED": "1"})
    try:
        launched = run_spawn(["--task", mock_task("stranded", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
        assert launched.returncode == spawn.ExitCode.OK, launched.stderr
        agent_dir = Path(json.loads(launched.stdout)["agent_dir"])
        assert wait_until((tmp_path / "token.pid").exists, 10)
        pid = int((tmp_path / "token.pid").read_text())
        if last_word is None:
            os.kill(pid, signal.SIGKILL)
        assert wait_until_gone([pid], 10) == []
        waited = run_spawn(["wait", "--session", str(agent_dir.parent.parent), agent_dir.name], env)
        assert waited.returncode != spawn.ExitCode.OK
        return load(agent_dir / "outcome.json")
    finally:
        end_services(tmp_path)


def test_a_token_killed_on_the_launchers_host_does_not_blame_the_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outcome = stranded(env, tmp_path, None)
    assert outcome["status"] == "failed"
    assert "was lost" not in outcome["reason"], outcome["reason"]
    assert outcome["reason"].startswith("its token ended on the launcher's host"), outcome["reason"]
    assert "the agent ran on the Ray node node-under-test (host node-host)" in outcome["reason"]


def test_the_services_last_word_names_its_lost_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outcome = stranded(env, tmp_path, "the Ray node node-under-test (host node-host) running it was lost: gone")
    assert outcome["status"] == "failed"
    assert outcome["reason"].startswith("the Ray node node-under-test (host node-host) running it was lost: gone"), outcome["reason"]


def test_a_bad_place_timeout_is_a_usage_error(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_PLACE_TIMEOUT": "soon"}
    proc = run_spawn(["--task", mock_task("x", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("spawn: error: SPAWN_RAY_PLACE_TIMEOUT='soon'"), proc.stderr
