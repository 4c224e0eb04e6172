"""Bench P12: a fan-out of N leaves from one root, placed locally, then on a local 3-node Ray cluster (same run).

Dev tool (imports tools/mock_model.py and tools/ray_place.py's token shape): ``RAY_PLACE_PYTHON=PY python
tools/bench_ray.py --leaves 40,120``, where PY has tools/ray_place.py.lock installed. `uvx nox -s ray_bench`
runs it. The cluster is tools/local_ray.py's, as in the cluster tests; all of it shares this one machine.

For each count and side, one JSON line:
- ``wall_s``: from the root's launch to its outcome (it launches every leaf, then waits for them all);
- ``outcomes``: each leaf's status, counted, and ``survivors``: agents' processes left after the root ended;
- ``peak_agents`` and ``peak_mem_mb``: agents launched and not yet ended (running, or waiting for one of the
  40 slots) at once, and the machine's memory in use above the baseline, at most; ``mem_mb_per_agent`` is
  the one over the other;
- on the cluster, ``placed_s``: from the placing side's taking a leaf's request to its runner started on a
  node (median, p90, max), from the leaves' runner.log lines;
- on the cluster, ``launcher_mb_per_agent``: what the launcher's host holds per placed agent, at the peak:
  a token's PSS (``token_pss_mb``), plus how much the placing side (the service and the host actors; on one
  machine they are all here) grew since the first leaf was placed (``placing_side_growth_mb``), over the
  tokens alive. The host actors' growth includes their runners' threads, so this overstates it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
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
import ray_place

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
BASH_TIMEOUT_MS = 600_000  # the Bash tool's most: a batch of launches, or the wait for them all
BATCH = 20  # leaves launched per Bash call
LOG_LINE = re.compile(r"ray_place: ([\d.]+)s: (placing agent|runner started by host actor)")
# Agents running at once on either side: what 2 cores and 23 GB take without swapping (the machine's limit).
MAX_CONCURRENT = 40


def fan_out_task(leaves: int) -> str:
    """The root's script: launch the leaves in the background in batches (their ids kept), then wait for them all."""
    leaf = mock_model.mock_task("leaf", [{"text": "leaf done"}])
    launch = mock_model.spawn_in_bash("--task", leaf, "--tools", "Read", "--background", "--print", "id")
    ids = '"$SPAWN_SESSION/bench-ids"'
    steps: list[dict[str, Any]] = []
    for start in range(0, leaves, BATCH):
        n = min(BATCH, leaves - start)
        loop = f"for i in $(seq {n}); do {launch} >> {ids} || echo failed; done; echo launched {n}"
        steps.append({"bash": loop, "timeout": BASH_TIMEOUT_MS})
    steps.append({"bash": f"{mock_model.SPAWN_IN_BASH} wait $(cat {ids}) >/dev/null; echo waited $?", "timeout": BASH_TIMEOUT_MS})
    return mock_model.mock_task("root", [*steps, {"text": "fanned out"}])


def is_token(proc: psutil.Process) -> bool:
    try:
        return proc.cmdline() == ["/bin/sh", "-c", ray_place.TOKEN_SCRIPT]
    except psutil.Error:
        return False


def children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.Error:  # ended since it was found
        return []


def pss(procs: list[psutil.Process]) -> int:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            continue
    return total


def placing_rss() -> int:
    """The host actors' and placement services' resident memory: the placing side, on this one machine."""
    total = 0
    for proc in psutil.process_iter(["cmdline"]):
        words = proc.info["cmdline"] or []
        if words and (words[0].startswith("ray::NodeHost") or any(w.endswith("ray_place.py") for w in words)):
            with_rss = proc.memory_info().rss if proc.is_running() else 0
            total += with_rss
    return total


class Sampler:
    """Once a second: agents running, memory in use, and on the cluster the tokens and the placing side."""

    def __init__(self, sessions: Path, placed: bool) -> None:
        self.sessions, self.placed = sessions, placed
        self.baseline = psutil.virtual_memory().used
        self.peak_mem = 0
        self.peak_agents = 0
        self.placing_at_start: int | None = None
        self.launcher_per_agent: float | None = None
        self.tokens_mb = 0.0
        self.placing_growth_mb = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def running(self) -> int:
        return sum(1 for d in self.sessions.glob("*/agents/*") if (d / "meta.json").exists() and not (d / "outcome.json").exists())

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.peak_mem = max(self.peak_mem, psutil.virtual_memory().used - self.baseline)
            agents = self.running()
            if agents > self.peak_agents:
                self.peak_agents = agents
                if self.placed:
                    self.sample_launcher()

    def sample_launcher(self) -> None:
        """The tokens' PSS, and how much the placing side grew since the first leaf's token (the root's is first)."""
        tokens = [p for p in psutil.process_iter() if is_token(p)]
        placing = placing_rss()
        if len(tokens) < 2:
            return
        if self.placing_at_start is None:
            self.placing_at_start = placing
        kids = [c for t in tokens for c in children(t)]
        self.tokens_mb = pss(tokens + kids) / len(tokens) / 2**20
        self.placing_growth_mb = max(0, placing - self.placing_at_start) / 2**20
        self.launcher_per_agent = self.tokens_mb + self.placing_growth_mb / len(tokens)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def placed_seconds(sessions: Path) -> list[float]:
    """Each placed leaf's time from its request taken to its runner started (its runner.log's ray_place lines)."""
    found = []
    for log in sessions.glob("*/agents/*/runner.log"):
        marks = {kind: float(t) for t, kind in LOG_LINE.findall(log.read_text(errors="replace"))}
        if len(marks) == 2:
            found.append(marks["runner started by host actor"] - marks["placing agent"])
    return sorted(found)


def run_side(env: dict[str, str], leaves: int, sessions: Path, placed: bool) -> dict[str, Any]:
    sessions.mkdir(parents=True)
    sampler = Sampler(sessions, placed)
    started = time.monotonic()
    root_args = ["--task", fan_out_task(leaves), "--tools", "Bash,Read", "--max-agents", str(leaves + 1)]
    root_args += ["--max-concurrent", str(MAX_CONCURRENT + 1), "--max-depth", "1", "--timeout", "3000"]
    root = subprocess.run([sys.executable, str(SPAWN), *root_args], env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    sampler.stop()
    statuses: dict[str, int] = {}
    reasons: dict[str, str] = {}  # one reason for each status but done: what went wrong, said once
    for outcome in sessions.glob("*/agents/*/outcome.json"):
        data = json.loads(outcome.read_text())
        status = str(data.get("status"))
        statuses[status] = statuses.get(status, 0) + 1
        if status != "done":
            reasons.setdefault(status, str(data.get("reason"))[:300])
    time.sleep(2)
    survivors = [p.pid for p in psutil.process_iter() if _agent_of(p, sessions)]
    result: dict[str, Any] = {
        "side": "ray_3_nodes_one_machine" if placed else "local",
        "leaves": leaves,
        "root_exit": root.returncode,
        "wall_s": round(wall, 1),
        "outcomes": statuses,
        **({"reasons": reasons} if reasons else {}),
        "survivors": len(survivors),
        "peak_agents": sampler.peak_agents,
        "peak_mem_mb": round(sampler.peak_mem / 2**20),
        "mem_mb_per_agent": round(sampler.peak_mem / 2**20 / max(1, sampler.peak_agents), 1),
    }
    if placed:
        seconds = placed_seconds(sessions)
        if seconds:
            p90 = seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))]
            result["placed_s"] = {
                "n": len(seconds),
                "median": round(statistics.median(seconds), 2),
                "p90": round(p90, 2),
                "max": round(seconds[-1], 2),
            }
        result["launcher_mb_per_agent"] = None if sampler.launcher_per_agent is None else round(sampler.launcher_per_agent, 2)
        result["token_pss_mb"] = round(sampler.tokens_mb, 2)
        result["placing_side_growth_mb"] = round(sampler.placing_growth_mb, 1)
    if root.returncode != 0:
        result["root_stderr"] = root.stderr[-1000:]
    return result


def _agent_of(proc: psutil.Process, sessions: Path) -> bool:
    try:
        return str(proc.environ().get("SPAWN_SESSION", "")).startswith(str(sessions)) or is_token(proc)
    except psutil.Error:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--leaves", default="40,120", help="comma-separated fan-out sizes (default 40,120)")
    p.add_argument("--node-memory", type=int, default=4_000_000_000, help="Ray memory per node, in bytes (admission)")
    args = p.parse_args()
    counts = [int(n) for n in args.leaves.split(",") if n.strip()]
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
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        cluster = local_ray.LocalCluster(str(Path(ray_python).parent / "ray"), Path(tmp))
        try:
            cluster.start(workers=2, memory=args.node_memory)
            for n in counts:
                local = run_side({**base, "SPAWN_SESSION_ROOT": f"{tmp}/local-{n}"}, n, Path(tmp) / f"local-{n}", placed=False)
                print(json.dumps(local), flush=True)
                where = {"SPAWN_PLACEMENT": f"ray:{cluster.address}", "SPAWN_RAY_PYTHON": ray_python}
                placed = run_side({**base, "SPAWN_SESSION_ROOT": f"{tmp}/ray-{n}", **where}, n, Path(tmp) / f"ray-{n}", placed=True)
                print(json.dumps(placed), flush=True)
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
