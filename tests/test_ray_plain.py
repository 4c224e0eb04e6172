"""spawn.py as users start it, on a cluster started as users start one (`uvx nox -s ray`; marked ray).

`uv run spawn.py --placement ray:ADDRESS`, no SPAWN_RAY_PYTHON, against a head
and one worker started with `ray start --head` and `ray start --address` and
Ray's defaults (only the head's port and temp dir chosen, so that the cluster
is this test's own on a shared machine). A module of its own, so that this
cluster is stopped before tests/test_ray_cluster.py's starts. Its last test
kills the worker's raylet: the node is gone for good.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import local_ray
import psutil
import pytest
from conftest import ROOT, agent_dirs, load, mock_task, run_spawn, stdout_json, wait_until
from test_ray_cluster import (
    HANG_S,
    RAY_CLI,
    RAY_PYTHON,
    Cluster,
    placements,
    processes_of,
    service_log,
    services,
    sleeping,
    standins,
    start_uv_spawn,
    uv_run_spawn,
)

import spawn

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def plain_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A head and one worker started as a user would: `ray start --head`, `ray start --address`, Ray's defaults."""
    if not Path(RAY_CLI).exists():
        pytest.skip("no ray here: run `uvx nox -s ray`, or set RAY_PLACE_PYTHON")
    local = local_ray.LocalCluster(RAY_CLI, tmp_path_factory.mktemp("ray-plain-logs"))
    try:
        local.start(workers=1, plain=True)
        yield Cluster(local)
    finally:
        local.stop()


def test_uv_run_spawn_places_an_agent_on_a_plainly_started_cluster(plain_cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """Ray's uv integration is off: the workers run the node's own Python, and nothing of the launcher's folder is uploaded."""
    task = mock_task("placed", [{"text": "placed under uv run"}])
    proc = uv_run_spawn(["--placement", f"ray:{plain_cluster.address}", "--task", task, "--tools", "Read"], env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr[-3000:]
    assert stdout_json(proc)["output"] == "placed under uv run"
    (agent_dir,) = agent_dirs(session_root)
    session = agent_dir.parent.parent
    meta, log, served = load(agent_dir / "meta.json"), (agent_dir / "runner.log").read_text(), service_log(session)
    assert meta["placement"]["backend"] == "ray" and meta["placement"]["node_id"], meta["placement"]
    # The record names the token the session's placement service started here, in a group of its own.
    assert f"token {meta['pid']} stands in for it here" in log, log
    assert meta["pgid"] == meta["pid"]
    assert "connected to" in served and "Ray 2.60.0" in served and "Python 3." in served, served
    [env_line] = [line for line in served.splitlines() if "runtime_env: " in line]
    assert json.loads(env_line.split("runtime_env: ", 1)[1]) == {"env_vars": {"PYTHONPATH": str(ROOT / "tools")}}
    assert "requested: memory 256 MiB" in log and "placed on node" in log, log
    assert f"worker: {Path(RAY_PYTHON).parent}" in log or f"worker: {RAY_PYTHON}" in log, log  # the node's own Python
    assert not list(Path(plain_cluster.local.temp_dir).rglob("_ray_pkg_*")), "a working_dir was uploaded"
    assert load(agent_dir / "outcome.json")["status"] == "done"
    assert wait_until(lambda: not standins(agent_dir) and not processes_of(agent_dir.name), 60)
    # The service leaves once idle: no process outlives the tree for long.
    assert wait_until(lambda: not services(session), 90), services(session)
    assert not list((session / "placement").glob("*.json"))


def test_a_placement_that_cannot_happen_names_the_actors_state_and_where_to_look(
    plain_cluster: Cluster, env: dict[str, str], session_root: Path
) -> None:
    """No node has the memory asked for: the stand-in gives up before the launcher, which quotes it and leaves nothing."""
    placed = {**env, "SPAWN_RAY_AGENT_MEMORY": str(10**13), "SPAWN_RAY_PLACE_TIMEOUT": "40"}  # 9 TiB (Ray's int64 holds 10**14)
    task = mock_task("unplaceable", [{"text": "never"}])
    proc = uv_run_spawn(["--placement", f"ray:{plain_cluster.address}", "--task", task, "--tools", "Read", "--background"], placed)
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("spawn: error: placement ray:"), line
    assert "placement group still PENDING after" in line and "raylet*.err" in line, line  # the placing side's word
    assert "runner.log ends: " in line and "requested: memory" in line, line  # the log's tail, quoted
    (agent_dir,) = agent_dirs(session_root)
    assert wait_until(lambda: not services(agent_dir.parent.parent), 90), services(agent_dir.parent.parent)


def raylet_of(node_id: str) -> psutil.Process:
    for proc in psutil.process_iter():
        try:
            if proc.name() == "raylet" and any(node_id in arg for arg in proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    raise AssertionError(f"no raylet for node {node_id}")


def driver_node(agent_dir: Path) -> str:
    """The node the session's placement service hangs on as a Ray driver (its log says): the head, on this one machine."""
    [node] = re.findall(r"as a driver on node (\w+)", service_log(agent_dir.parent.parent))
    return str(node)


def test_a_raylet_killed_mid_run_fails_the_agent_naming_the_node(plain_cluster: Cluster, env: dict[str, str], session_root: Path) -> None:
    """The service outlives the node (it hangs on another) and leaves its last word: the outcome names the node, lost."""
    placed = plain_cluster.env(env)
    task = mock_task("doomed", [{"bash": "echo busy; sleep 120"}, {"text": "never"}])
    roots: dict[Path, subprocess.Popen[str]] = {}
    doomed = None
    for _ in range(6):  # agents go to the freest node: one of the first few lands off the services' own (the head)
        root = start_uv_spawn(["--task", task, "--tools", "Bash"], placed)
        assert wait_until(lambda: len([d for d in placements(session_root).values() if d.get("node_id")]) > len(roots), HANG_S)
        [agent_dir] = [d for d in agent_dirs(session_root) if d not in roots]
        roots[agent_dir] = root
        assert wait_until(functools.partial(sleeping, agent_dir), HANG_S)
        if placements(session_root)[agent_dir.name]["node_id"] != driver_node(agent_dir):
            doomed = agent_dir
            break
    assert doomed is not None, "every agent was placed on its service's own node"
    node_id = placements(session_root)[doomed.name]["node_id"]
    raylet_of(node_id).kill()
    out, err = roots[doomed].communicate(timeout=HANG_S)
    summary = json.loads(out)  # still one JSON object on the root's stdout
    assert summary["status"] == "failed", (summary, err)
    outcome = load(doomed / "outcome.json")
    assert outcome["status"] == "failed"
    # Whoever settles it (wait, the guard) quotes the stand-in's last word.
    assert outcome["reason"].startswith(f"the Ray node {node_id} (host "), outcome["reason"]
    assert "running it was lost" in outcome["reason"], outcome["reason"]
    assert wait_until(lambda: not processes_of(doomed.name), 60)
    for other, root in roots.items():
        if other != doomed:
            run_spawn(["kill", "--session", str(other.parent.parent), other.name], env, timeout=HANG_S)
            root.communicate(timeout=HANG_S)
    assert wait_until(lambda: not any(processes_of(d.name) for d in roots), 60)
    # Last in the file: the killed node is gone for good, and Ray may place on it until its heartbeats time out.
