"""spawn.py's side of a Ray placement, without Ray: a stand-in program plays tools/ray_place.py.

The stand-in does what the sibling's contract says (sessions and docs/cluster.md):
it reads the agent's meta.json-to-be on stdin, prints one JSON line naming the node, then runs spawn.py's own runner with
SPAWN_RAY_STANDIN set to its pid, as the host actor would on a node. The agent
is real (the bundled CLI against the scripted model); only Ray is left out.
The cluster itself is tested by `uvx nox -s ray` (tests/test_ray_cluster.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from conftest import agent_dirs, load, mock_task, run_spawn, wait_until_gone

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


SILENT = r"""
import json, os, subprocess, sys, time
open(os.environ["STAND_IN_ARGS"], "w").write(json.dumps({"argv": sys.argv[1:], "started": time.time()}))
print("fake: connecting to the cluster", file=sys.stderr, flush=True)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a Ray driver's helpers: same group
open(os.environ["STAND_IN_PID_FILE"], "w").write(json.dumps([os.getpid(), helper.pid]))
time.sleep(600)
"""


def test_a_silent_stand_in_is_told_to_give_up_first_then_ended_with_its_group(
    env: dict[str, str], session_root: Path, tmp_path: Path
) -> None:
    """Its deadline (--place-by) comes before the launcher's; past the launcher's, its whole group goes and the log is quoted."""
    sibling = tmp_path / "silent.py"
    sibling.write_text(SILENT)
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_SIBLING": str(sibling), "SPAWN_RAY_PLACE_TIMEOUT": "4"}
    placed["STAND_IN_ARGS"] = str(tmp_path / "args.json")
    proc = run_spawn(["--task", mock_task("silent", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
    gave_up = time.time()
    assert proc.returncode == spawn.ExitCode.STATE, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("spawn: error: placement ray:10.0.0.1:6379: the agent was not placed: its stand-in"), line
    assert "said nothing in 4 s" in line and "runner.log ends: fake: connecting to the cluster" in line, line
    assert wait_until_gone(json.loads((tmp_path / "stand-in.pid").read_text()), 10) == []  # the stand-in and its helper
    asked = json.loads((tmp_path / "args.json").read_text())
    place_by = float(asked["argv"][asked["argv"].index("--place-by") + 1])
    # Told to give up a quarter of the launcher's limit before the launcher does.
    assert asked["started"] < place_by < asked["started"] + 3.01 and place_by < gave_up - 0.9, (asked["started"], place_by, gave_up)


WRAPPER = r"""
import os, subprocess, sys
# As `uv run --script`: the launcher's child runs the stand-in as its own child.
sys.exit(subprocess.call([sys.executable, os.environ["REAL_STAND_IN"], *sys.argv[1:]]))
"""


def test_a_stand_in_under_a_wrapper_is_recorded_by_its_own_pid(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    """The stand-in reports its pid: meta.json names it, not the uv above it, so its runner on the node runs."""
    wrapper, real = tmp_path / "wrapper.py", tmp_path / "real_stand_in.py"
    wrapper.write_text(WRAPPER)
    real.write_text(STAND_IN.replace('"boot_id": boot}', '"boot_id": boot, "pid": os.getpid()}'))
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_SIBLING": str(wrapper), "REAL_STAND_IN": str(real)}
    proc = run_spawn(["--task", mock_task("wrapped", [{"text": "ran under its stand-in"}]), "--tools", "Read"], placed)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert json.loads(proc.stdout)["output"] == "ran under its stand-in"
    (agent_dir,) = agent_dirs(session_root)
    meta = load(agent_dir / "meta.json")
    assert meta["pid"] == int((tmp_path / "stand-in.pid").read_text())
    assert meta["pgid"] != meta["pid"]  # the wrapper's group, which the launcher made


STRANDED = r"""
import json, os, sys, time
args = sys.argv[1:]
agent_dir = args[args.index("--") + 1]
sys.stdin.read()
print(json.dumps({"backend": "ray", "node_id": "node-under-test", "host": "node-host", "boot_id": "b", "pid": os.getpid()}), flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
open(os.environ["STAND_IN_PID_FILE"], "w").write(str(os.getpid()))
if os.environ.get("LAST_WORD"):  # as ray_place.py does when its node is lost
    while not os.path.exists(os.path.join(agent_dir, "meta.json")):
        time.sleep(0.02)
    word = {"exit_code": 1, "reason": os.environ["LAST_WORD"], "pid": os.getpid()}
    open(os.path.join(agent_dir, "standin-exit.json"), "w").write(json.dumps(word))
    sys.exit(1)
time.sleep(600)
"""


def stranded(env: dict[str, str], tmp_path: Path, last_word: str | None) -> dict[str, str]:
    """A placed agent whose stand-in ends with no runner ever started: killed here, or with a last word."""
    sibling = tmp_path / "stranded.py"
    sibling.write_text(STRANDED)
    launched = run_spawn(
        ["--task", mock_task("stranded", [{"text": "x"}]), "--tools", "Read", "--background"],
        {**placed_env(env, tmp_path), "SPAWN_RAY_SIBLING": str(sibling), **({"LAST_WORD": last_word} if last_word else {})},
    )
    assert launched.returncode == spawn.ExitCode.OK, launched.stderr
    agent_dir = Path(json.loads(launched.stdout)["agent_dir"])
    pid = int((tmp_path / "stand-in.pid").read_text())
    if last_word is None:
        os.kill(pid, signal.SIGKILL)
    assert wait_until_gone([pid], 10) == []
    waited = run_spawn(["wait", "--session", str(agent_dir.parent.parent), agent_dir.name], env)
    assert waited.returncode != spawn.ExitCode.OK
    return load(agent_dir / "outcome.json")


def test_a_stand_in_killed_on_the_launchers_host_does_not_blame_the_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outcome = stranded(env, tmp_path, None)
    assert outcome["status"] == "failed"
    assert "was lost" not in outcome["reason"], outcome["reason"]
    assert outcome["reason"].startswith("its stand-in ended on the launcher's host"), outcome["reason"]
    assert "the agent ran on the Ray node node-under-test (host node-host)" in outcome["reason"]


def test_a_stand_ins_last_word_names_its_lost_node(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    outcome = stranded(env, tmp_path, "the Ray node node-under-test (host node-host) running it was lost: gone")
    assert outcome["status"] == "failed"
    assert outcome["reason"].startswith("the Ray node node-under-test (host node-host) running it was lost: gone"), outcome["reason"]


def test_a_bad_place_timeout_is_a_usage_error(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    placed = {**placed_env(env, tmp_path), "SPAWN_RAY_PLACE_TIMEOUT": "soon"}
    proc = run_spawn(["--task", mock_task("x", [{"text": "x"}]), "--tools", "Read", "--background"], placed)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("spawn: error: SPAWN_RAY_PLACE_TIMEOUT='soon'"), proc.stderr
