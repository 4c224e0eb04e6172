"""spawn.py's side of a Ray placement, without Ray: a stand-in program plays tools/ray_place.py.

The stand-in does what the sibling's contract says (sessions and docs/cluster.md):
it reads the agent's meta.json-to-be on stdin, prints one JSON line naming the node, then runs spawn.py's own runner with
SPAWN_RAY_STANDIN set to its pid, as the host actor would on a node. The agent
is real (the bundled CLI against the scripted model); only Ray is left out.
The cluster itself is tested by `uvx nox -s ray` (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import agent_dirs, load, mock_task, run_spawn

import spawn

STAND_IN = r"""
import json, os, subprocess, sys, time
args = sys.argv[1:]
spawn_argv = args[args.index("--spawn") + 1 : args.index("--")]
agent_dir = args[args.index("--") + 1]
asked = json.loads(sys.stdin.read())  # the launcher's meta.json-to-be, for the claim
assert asked["id"] == os.path.basename(agent_dir), asked
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
print(json.dumps({"backend": "ray", "node_id": "node-under-test", "host": os.uname().nodename, "boot_id": boot}), flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # as the sibling: nothing more reaches the launcher's stdout
while not os.path.exists(os.path.join(agent_dir, "meta.json")):
    time.sleep(0.02)
open(os.environ["STAND_IN_PID_FILE"], "w").write(str(os.getpid()))
env = {**os.environ, "SPAWN_RAY_STANDIN": str(os.getpid())}
sys.exit(subprocess.call([*spawn_argv, "_run", agent_dir], env=env, start_new_session=True))
"""


def placed_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    stand_in = tmp_path / "ray_place.py"
    stand_in.write_text(STAND_IN)
    placed = {"SPAWN_PLACEMENT": "ray:10.0.0.1:6379", "SPAWN_RAY_SIBLING": str(stand_in), "SPAWN_RAY_PYTHON": sys.executable}
    return {**env, **placed, "STAND_IN_PID_FILE": str(tmp_path / "stand-in.pid")}


def test_a_placed_agent_runs_under_its_stand_in_and_records_its_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    proc = run_spawn(["--task", mock_task("placed", [{"text": "from the node"}]), "--tools", "Read"], placed_env(env, tmp_path))
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = json.loads(proc.stdout)  # one JSON object: the stand-in's line never reaches it
    assert result["status"] == "done" and result["output"] == "from the node"
    (agent_dir,) = agent_dirs(session_root)
    meta = load(agent_dir / "meta.json")
    assert meta["placement"]["backend"] == "ray" and meta["placement"]["node_id"] == "node-under-test"
    assert meta["placement"]["policy"] == "ray:10.0.0.1:6379"
    assert meta["host"] and meta["boot_id"]
    assert meta["pid"] == int((tmp_path / "stand-in.pid").read_text())  # meta names the stand-in, not the runner
    assert load(agent_dir / "outcome.json")["status"] == "done"


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
