"""Agents placed on a local 3-node Ray cluster (`uvx nox -s ray`; marked ray, never in the default suite).

A head and two workers, started and stopped by pid by tools/local_ray.py
(never `ray stop`: it ends every Ray cluster on the machine).

The agents are real: the bundled claude CLI against the scripted model,
started by spawn.py's own runner on the node the host actor landed on.
Placed agents are launched as users start them: `uv run spawn.py`, with no
SPAWN_RAY_PYTHON, so uv runs tools/ray_place.py from its own lock.
Outside nox, point RAY_PLACE_PYTHON at a python with tools/ray_place.py.lock
installed (its `ray` executable is used to start the nodes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import local_ray
import psutil
import pytest
from conftest import ROOT, SPAWN, agent_dirs, load, mock_task, run_spawn, spawn_in_bash, stdout_json, wait_until

import spawn

pytestmark = pytest.mark.ray

RAY_PYTHON = os.environ.get("RAY_PLACE_PYTHON") or sys.executable  # not SPAWN_*: conftest clears those
RAY_CLI = str(Path(RAY_PYTHON).parent / "ray")
HANG_S = 240
CAN_UNSHARE = os.geteuid() == 0 and shutil.which("unshare") is not None


@dataclass
class Cluster:
    """A started local cluster, and how a test's spawn.py is pointed at it."""

    local: local_ray.LocalCluster

    @property
    def address(self) -> str:
        return self.local.address

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """As users point spawn.py at a cluster: SPAWN_PLACEMENT only (uv runs the sibling from its own lock)."""
        return {**base, "SPAWN_PLACEMENT": f"ray:{self.address}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not Path(RAY_CLI).exists():
        pytest.skip("no ray here: run `uvx nox -s ray`, or set RAY_PLACE_PYTHON")
    local = local_ray.LocalCluster(RAY_CLI, tmp_path_factory.mktemp("ray-logs"))
    try:
        # The second worker in a pid namespace of its own where that can be made (root, unshare).
        local.start(workers=2, own_pid_namespace=CAN_UNSHARE)
        yield Cluster(local)
    finally:
        local.stop()


def uv_run_spawn(args: list[str], env: dict[str, str], timeout: float = HANG_S) -> subprocess.CompletedProcess[str]:
    """`uv run spawn.py ARGS`, as the README starts it: uv is the launcher's parent, and no SPAWN_RAY_PYTHON is set."""
    assert "SPAWN_RAY_PYTHON" not in env
    argv = ["uv", "run", "--quiet", str(SPAWN), *args]
    return subprocess.run(argv, env=uv_env(env), capture_output=True, text=True, timeout=timeout, check=False)


def start_uv_spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`uv run spawn.py ARGS` in a process group of its own, as a terminal's foreground job (uv, then spawn.py)."""
    assert "SPAWN_RAY_PYTHON" not in env
    argv = ["uv", "run", "--quiet", str(SPAWN), *args]
    return subprocess.Popen(argv, env=uv_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def uv_env(env: dict[str, str]) -> dict[str, str]:
    """The test's environment, with the user's uv cache: its HOME is the test's own, and uv would build every env afresh."""
    cache = os.environ.get("UV_CACHE_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv")
    return {**env, "UV_CACHE_DIR": cache}


def standins(agent_dir: Path) -> list[psutil.Process]:
    """The agent's placing side on this host: its token (the pid its meta.json names), while it runs."""
    try:
        meta = load(agent_dir / "meta.json")
        token = psutil.Process(int(meta["pid"]))
        return [token] if token.status() != psutil.STATUS_ZOMBIE else []
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return []


def services(session: Path) -> list[psutil.Process]:
    """The session's placement services on this host (their command lines name its placement folder; not the uv that runs one)."""
    found = []
    for proc in psutil.process_iter():
        try:
            words = proc.cmdline()
            if proc.name() != "uv" and any("ray_place.py" in w for w in words) and any(str(session / "placement") in w for w in words):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def service_log(session: Path) -> str:
    """What the session's placement services said (their logs beside their records)."""
    return "".join(p.read_text() for p in sorted((session / "placement").glob("*.log")))


def placements(session_root: Path) -> dict[str, dict[str, Any]]:
    """Each agent's placement, once its meta.json is published (the launcher writes it after the stand-in reports)."""
    return {d.name: load(d / "meta.json").get("placement") or {} for d in agent_dirs(session_root) if (d / "meta.json").exists()}


def processes_of(agent_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("SPAWN_AGENT_ID") == agent_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_fan_out_spreads_over_nodes(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    placed = cluster.env(env)
    started = [
        start_uv_spawn(["--task", mock_task(f"leaf {i}", [{"text": f"leaf {i} done"}]), "--tools", "Read"], placed) for i in range(4)
    ]
    results = []
    for proc in started:
        out, err = proc.communicate(timeout=HANG_S)
        assert proc.returncode == spawn.ExitCode.OK, err
        results.append(json.loads(out))  # one JSON object: nothing of Ray's on stdout
    assert sorted(r["output"] for r in results) == [f"leaf {i} done" for i in range(4)]
    where = placements(session_root)
    assert all(p.get("backend") == "ray" and p.get("node_id") for p in where.values()), where
    assert len({p["node_id"] for p in where.values()}) >= 2, where


def sleeping(agent_dir: Path) -> bool:
    """Whether the agent's Bash runs its `sleep 120` (the CLI gave it the agent's environment): it is mid-run."""
    for proc in processes_of(agent_dir.name):
        try:
            if "sleep" in " ".join(proc.cmdline()):
                return True
        except psutil.Error:  # ended (or a zombie) since it was found
            continue
    return False


def test_a_kill_mid_run_records_killed_and_leaves_nothing(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    placed = cluster.env(env)
    task = mock_task("sleeper", [{"bash": "echo busy; sleep 120"}, {"text": "woke"}])
    launched = stdout_json(uv_run_spawn(["--task", task, "--tools", "Bash", "--background"], placed))
    agent_dir = Path(launched["agent_dir"])
    assert wait_until(lambda: sleeping(agent_dir), HANG_S)
    killed = run_spawn(["kill", "--session", str(agent_dir.parent.parent), agent_dir.name], env, timeout=HANG_S)
    assert killed.returncode == spawn.ExitCode.OK, killed.stderr
    assert wait_until((agent_dir / "outcome.json").exists, HANG_S)
    assert load(agent_dir / "outcome.json")["status"] == "killed"
    assert wait_until(lambda: not processes_of(agent_dir.name), 60), processes_of(agent_dir.name)
    assert len(agent_dirs(session_root)) == 1  # nothing admitted after the kill


def test_ctrl_c_on_a_foreground_placed_agent_interrupts_it_on_its_node(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """A terminal's Ctrl-C reaches the foreground spawn.py alone (the stand-in has a session of its own): it is passed on."""
    task = mock_task("sleeper", [{"bash": "echo busy; sleep 120"}, {"text": "woke"}])
    proc = start_uv_spawn(["--task", task, "--tools", "Bash"], cluster.env(env))
    assert wait_until(lambda: any(p.get("node_id") for p in placements(session_root).values()), HANG_S)
    (agent_dir,) = agent_dirs(session_root)
    assert wait_until(lambda: sleeping(agent_dir), HANG_S)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group, uv and spawn.py
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == spawn.ExitCode.INTERRUPTED, err
    assert json.loads(out)["status"] == "interrupted"
    assert load(agent_dir / "outcome.json")["status"] == "interrupted"
    assert wait_until(lambda: not processes_of(agent_dir.name), 60), processes_of(agent_dir.name)


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


@pytest.mark.skipif(not CAN_UNSHARE, reason="a node in its own pid namespace needs root and unshare")
def test_a_leaf_in_another_pid_namespace_is_watched_and_killed_from_here(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """Its runner's pids mean nothing here: status, wait and kill go through its stand-in, its actor and its heartbeat."""
    placed, ours = cluster.env(env), pid_namespace(os.getpid())
    task = mock_task("sleeper", [{"bash": "echo busy; sleep 120"}, {"text": "woke"}])
    launched: list[Path] = []

    def runs_elsewhere(agent_dir: Path) -> bool:
        return any(pid_namespace(p.pid) not in (None, ours) for p in processes_of(agent_dir.name))

    isolated = None
    for _ in range(6):  # SPREAD goes round the three nodes: one of the first few lands on the isolated one
        started = uv_run_spawn(["--task", task, "--tools", "Bash", "--background"], placed)
        launched.append(Path(stdout_json(started)["agent_dir"]))
        assert wait_until(lambda: sleeping(launched[-1]), HANG_S)
        if runs_elsewhere(launched[-1]):
            isolated = launched[-1]
            break
    assert isolated is not None, "no leaf was placed on the node in its own pid namespace"
    status = stdout_json(run_spawn(["status", "--json", str(isolated.parent.parent)], env))
    assert status["agents"][0]["state"] == "running", status
    killed = run_spawn(["kill", "--session", str(isolated.parent.parent), isolated.name], env, timeout=HANG_S)
    assert killed.returncode == spawn.ExitCode.OK, killed.stderr
    assert wait_until((isolated / "outcome.json").exists, HANG_S)
    assert load(isolated / "outcome.json")["status"] == "killed"
    assert wait_until(lambda: not processes_of(isolated.name), 60), processes_of(isolated.name)
    for other in launched[:-1]:
        run_spawn(["kill", "--session", str(other.parent.parent), other.name], env, timeout=HANG_S)
    assert wait_until(lambda: not any(processes_of(d.name) for d in launched), 60)


def test_a_placed_agents_child_gets_its_claim_from_the_parents_host_actor(
    cluster: Cluster, env: dict[str, str], session_root: Path
) -> None:
    """The tree's key stays in the host actors: a child's claim is minted by its parent's actor, for its process tree only."""
    child = mock_task("child", [{"text": "child done"}])
    steps = [{"bash": spawn_in_bash("--task", child, "--tools", "Read")}, {"bash": "echo waiting; sleep 120"}, {"text": "never"}]
    launched = stdout_json(uv_run_spawn(["--task", mock_task("parent", steps), "--tools", "Bash,Read", "--background"], cluster.env(env)))
    parent = Path(launched["agent_dir"])
    assert wait_until(lambda: sleeping(parent), HANG_S)
    [kid] = [d for d in agent_dirs(session_root) if d != parent]
    assert load(kid / "outcome.json")["status"] == "done"
    assert load(kid / "meta.json")["placement"]["backend"] == "ray"
    assert f"placing agent {kid.name} from placement service" in (kid / "runner.log").read_text()  # its parent's node's
    assert len(services(session_root / kid.parent.parent.name)) <= 1  # no driver started below the root
    assert "not placed" not in (kid / "runner.log").read_text()
    # The parent's placer socket, from its runner's environment: a process outside its tree gets nothing placed.
    [placer] = {p.environ()["SPAWN_RAY_PLACER"] for p in processes_of(parent.name) if "SPAWN_RAY_PLACER" in p.environ()}
    stray = parent.parent / "a9-000000"
    stray.mkdir()
    asked = {"agent_dir": str(stray), "asked": {"id": stray.name, "parent_id": parent.name, "max_depth": 50}, "spawn": ["true"]}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(30)
        client.connect(placer)
        client.sendall(json.dumps(asked).encode() + b"\n")
        lines = client.makefile("rb")
        assert json.loads(lines.readline()) == {"taken": True}
        answer = json.loads(lines.readline())
    assert "not in the process tree of any agent" in answer["error"], answer
    assert "placement group requested" not in (stray / "runner.log").read_text()
    killed = run_spawn(["kill", "--session", str(parent.parent.parent), parent.name], env, timeout=HANG_S)
    assert killed.returncode == spawn.ExitCode.OK, killed.stderr
    assert wait_until(lambda: not processes_of(parent.name), 60)


def test_placed_agents_end_with_their_placement_service(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """The service SIGKILLed mid-run: Ray ends its job's host actors, their runners get their death signal, the
    token sees its pipe close; the agent is settled, and nothing of it is left on any node."""
    task = mock_task("sleeper", [{"bash": "echo busy; sleep 120"}, {"text": "never"}])
    launched = stdout_json(uv_run_spawn(["--task", task, "--tools", "Bash", "--background"], cluster.env(env)))
    agent_dir = Path(launched["agent_dir"])
    session = agent_dir.parent.parent
    assert wait_until(lambda: sleeping(agent_dir), HANG_S)
    [service] = services(session)
    service.kill()
    assert wait_until(lambda: not processes_of(agent_dir.name), 120), processes_of(agent_dir.name)
    assert wait_until(lambda: not standins(agent_dir), 30), standins(agent_dir)
    waited = run_spawn(["wait", "--session", str(session), agent_dir.name], env, timeout=HANG_S)
    assert waited.returncode != spawn.ExitCode.OK
    outcome = load(agent_dir / "outcome.json")
    assert outcome["status"] == "failed", outcome


def test_a_placed_tree_with_a_budget_is_metered_by_its_one_gateway(cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """Its nodes reach the tree's gateway off loopback, each agent with its own credential: every call is metered, none soft."""
    child = mock_task("child", [{"text": "child done"}])
    steps = [{"bash": spawn_in_bash("--task", child, "--tools", "Read")}, {"text": "root done"}]
    args = ["--task", mock_task("root", steps), "--tools", "Bash,Read", "--max-budget-usd", "5"]
    done = uv_run_spawn(args, cluster.env(env))
    assert done.returncode == spawn.ExitCode.OK, done.stderr[-3000:]
    assert "budget: soft" not in done.stderr, done.stderr
    dirs = agent_dirs(session_root)
    assert len(dirs) == 2 and all(load(d / "meta.json")["placement"]["backend"] == "ray" for d in dirs)
    (ledger,) = session_root.glob("*/ledger.jsonl")
    state = spawn.ledger_state(ledger.read_text().splitlines())
    for d in dirs:  # the gateway's own charge for each, and the outcome's cost is the gateway's
        outcome = load(d / "outcome.json")
        assert state.spends.get(d.name, 0) > 0, (d.name, state.spends)
        assert outcome["cost_usd"] == pytest.approx(state.spends[d.name], abs=1e-6) and "cli_cost_usd" in outcome, outcome
    assert wait_until(lambda: not any(processes_of(d.name) for d in dirs), 60)


CLAIM_DRIVER = r"""
import json, sys, os
sys.path.insert(0, sys.argv[2])
os.environ["RAY_task_oom_retries"] = "0"
import ray, ray_place, spawn_claims
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": sys.argv[2]}})
agent_dir = sys.argv[3]
key = spawn_claims.new_tree_key()
raw = ray_place.raw_key(key)
host = ray.remote(ray_place.NodeHost).options(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=4).remote("spawn-host-test")
node = ray.get(host.where.remote())["node_id"]
claim = spawn_claims.Claim(session="s", parent=None, child=os.path.basename(agent_dir), audience=node, depth=1, max_depth=2,
    deadline=None, budget_hold_usd=None, tools=("Read",), deny=(), ask=(), permission_mode="dontAsk")
text, sig = spawn_claims.sign_claim(claim, key)
marker = os.path.join(agent_dir, "started")
argv = ["/bin/sh", "-c", "touch " + marker]
results = {
    "missing": ray.get(host.run.remote(None, argv, {}, agent_dir)),
    "tampered": ray.get(host.run.remote((text.replace('"max_depth":2', '"max_depth":9'), sig, raw), argv, {}, agent_dir)),
    "good": ray.get(host.run.remote((text, sig, raw), argv, {}, agent_dir)),
    "replayed": ray.get(host.run.remote((text, sig, raw), argv, {}, agent_dir)),
}
open(sys.argv[4], "w").write(json.dumps(results))
"""


def test_a_node_refuses_missing_tampered_and_replayed_claims(cluster: Cluster, tmp_path: Path) -> None:
    agent_dir = tmp_path / "a1-00c1a1"
    agent_dir.mkdir()
    report = tmp_path / "results.json"  # not stdout: a driver's stdout is Ray's too
    proc = subprocess.run(
        [RAY_PYTHON, "-c", CLAIM_DRIVER, cluster.address, str(ROOT / "tools"), str(agent_dir), str(report)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=HANG_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    raw = report.read_text()
    results = json.loads(raw)
    assert "no claim" in results["missing"]["refused"]
    assert "signature" in results["tampered"]["refused"]
    assert results["good"] == {"exit_code": 0}
    assert "replayed" in results["replayed"]["refused"] or "already" in results["replayed"]["refused"]
    assert (agent_dir / "started").exists()
