"""Bench: N leaves placed on a local 3-node Ray cluster against the same leaves placed locally (one run each).

Dev tool (imports tools/mock_model.py): ``RAY_PLACE_PYTHON=PY python tools/bench_ray.py --leaves 40``,
where PY has tools/ray_place.py.lock installed. Prints one JSON object: wall time from the first launch
to the last outcome, and the machine's peak memory in use above the baseline, for each side.
The cluster is tools/local_ray.py's, as in the cluster tests. `uvx nox -s ray_bench` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import local_ray
import mock_model
import psutil

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"


def run_side(env: dict[str, str], leaves: int, session_root: Path) -> dict[str, Any]:
    """Launch the leaves in the background, wait for them all; wall time and peak memory above the start."""
    baseline, peak, done = psutil.virtual_memory().used, [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], psutil.virtual_memory().used - baseline)
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    started = time.monotonic()
    launched = []  # (session, id): each leaf is a root of its own session
    for i in range(leaves):
        args = ["--task", mock_model.mock_task(f"leaf {i}", [{"text": f"leaf {i}"}]), "--tools", "Read", "--background"]
        out = json.loads(subprocess.run([sys.executable, str(SPAWN), *args], env=env, capture_output=True, text=True, check=True).stdout)
        launched.append((str(Path(out["agent_dir"]).parent.parent), str(out["id"])))
    statuses = []
    for session, agent in launched:  # they run side by side; waiting in turn ends with the last outcome
        waited = subprocess.run(
            [sys.executable, str(SPAWN), "wait", "--session", session, agent], env=env, capture_output=True, text=True, check=False
        )
        if not waited.stdout.strip():
            raise SystemExit(f"bench_ray: error: spawn.py wait gave nothing (exit {waited.returncode}): {waited.stderr.strip()}")
        statuses += [a["status"] for a in json.loads(waited.stdout)["agents"]]
    wall = time.monotonic() - started
    done.set()
    return {
        "leaves": leaves,
        "wall_s": round(wall, 1),
        "peak_mem_mb": round(peak[0] / 2**20),
        "done": statuses.count("done"),
        "other": len(statuses) - statuses.count("done"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--leaves", type=int, default=40)
    args = p.parse_args()
    ray_python = os.environ.get("RAY_PLACE_PYTHON") or sys.executable
    with tempfile.TemporaryDirectory() as tmp, mock_model.serve(Path(tmp)) as served:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SPAWN_")}
        home = Path(tmp) / "home"
        home.mkdir()
        base |= {
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": served.url,
            "ANTHROPIC_API_KEY": "sk-ant-mock",
        }
        base |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        local = run_side({**base, "SPAWN_SESSION_ROOT": f"{tmp}/local"}, args.leaves, Path(tmp) / "local")
        cluster = local_ray.LocalCluster(str(Path(ray_python).parent / "ray"), Path(tmp))
        try:
            cluster.start(workers=2, memory=4_000_000_000)
            where = {"SPAWN_PLACEMENT": f"ray:{cluster.address}", "SPAWN_RAY_PYTHON": ray_python}
            placed = run_side({**base, "SPAWN_SESSION_ROOT": f"{tmp}/ray", **where}, args.leaves, Path(tmp) / "ray")
        finally:
            cluster.stop()
    print(json.dumps({"local": local, "ray_3_nodes_one_machine": placed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
