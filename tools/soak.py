#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["jsonschema>=4.23,<5", "psutil>=6,<8"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""Kill trials: SIGKILL random processes of a live agent tree, then check nothing leaked.

Each trial runs a real tree through spawn.py and the bundled claude CLI,
against tools/mock_model.py:

    root            starts two children in the background and waits for both
    ├── kid         starts a grandchild in the foreground
    │   └── leaf    thinks for a while
    └── kid         (the same)

At a random moment (seeded) it SIGKILLs one process of a random level: that
agent's spawn.py or its claude CLI. When the tree has ended it checks what a
user relies on:

- survivors: processes of the tree still alive 5 s after the kill grace;
- agents without an outcome, and agents with two markers (.done and .fail);
- records that don't validate against schemas/.

Run it where spawn.py's dependencies are installed (`uvx nox -s soak`):

    python tools/soak.py --trials 200 --seed 1 --jobs 2 [--json FILE]

Exit status 0 when every trial was clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported
from mock_model import READ_ID, mock_task, serve, spawn_in_bash

ROOT = Path(__file__).resolve().parent.parent
SPAWN = ROOT / "spawn.py"
SCHEMAS = ROOT / "schemas"

KILL_GRACE_S = 3.0  # spawn.py's grace between SIGTERM and SIGKILL
SURVIVOR_WINDOW_S = KILL_GRACE_S + 5.0  # what the reliability promise allows
TREE_TIMEOUT_S = 90.0  # a tree still running after this is itself a failure
LEAF_THINKING_S = 3.0


def tree_task(trial: int) -> str:
    leaf = mock_task(f"leaf of trial {trial}", [{"text": "thinking", "sleep": LEAF_THINKING_S}, {"text": "leaf done"}])
    kid = mock_task(f"kid of trial {trial}", [{"bash": spawn_in_bash("--task", leaf, "--tools", "Read")}, {"text": "kid done"}])
    launch = "; ".join(
        f'ids="$ids $({spawn_in_bash("--background", "--tools", "Bash,Read", "--task", kid)} | {READ_ID})"' for _ in range(2)
    )
    wait = f'ids=""; {launch}; {spawn_in_bash("wait")} $ids --all'
    return mock_task(f"root of trial {trial}", [{"bash": wait}, {"text": "root done"}])


@dataclass
class Trial:
    trial: int
    seed: int
    killed: str = ""
    agents: int = 0
    survivors: list[str] = field(default_factory=list)
    without_outcome: list[str] = field(default_factory=list)
    two_outcomes: list[str] = field(default_factory=list)
    invalid_records: list[str] = field(default_factory=list)
    unregistered_dirs: int = 0
    error: str = ""

    @property
    def clean(self) -> bool:
        return not (self.survivors or self.without_outcome or self.two_outcomes or self.invalid_records or self.error)


class Tracker:
    """Every process the tree ever had, by (pid, create time): pids get reused."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], str] = {}

    def add(self, proc: psutil.Process) -> None:
        try:
            with proc.oneshot():
                cmd = proc.cmdline()
                # The head says what it is, the tail (a guard's agent dir) whose it is.
                self.seen.setdefault((proc.pid, proc.create_time()), " ".join(cmd)[:120] + (f" ... {cmd[-1]}" if len(cmd) > 1 else ""))
        except psutil.Error:
            pass

    def add_tree(self, pid: int) -> None:
        try:
            root = psutil.Process(pid)
            self.add(root)
            for child in root.children(recursive=True):
                self.add(child)
        except psutil.Error:
            pass

    def alive(self) -> list[str]:
        out = []
        for (pid, created), cmd in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE:
                    # An exec keeps the pid: a guard's sh becomes `spawn.py _guard`.
                    now = " ".join(proc.cmdline())
                    became = f" (now: {now[:160]})" if not cmd.startswith(now[:120]) else ""
                    out.append(f"{pid} {cmd}{became}{pipe_holders(pid)}")
            except psutil.Error:
                pass
        return out


def pipe_holders(pid: int) -> str:
    """For a process waiting on a pipe at its stdin (a guard): who else holds that pipe.

    A guard waits for EOF, so a survivor's pipe is still open somewhere;
    naming the holders says which process kept it (Linux /proc only).
    """
    try:
        target = os.readlink(f"/proc/{pid}/fd/0")
    except OSError:
        return ""
    if not target.startswith("pipe:"):
        return ""
    holders = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) == target:
                        with contextlib.suppress(psutil.Error):
                            holders.append(f"{entry.name} (fd {fd.name}) {' '.join(psutil.Process(int(entry.name)).cmdline())[:160]}")
                        break
    state = ""
    with contextlib.suppress(OSError, psutil.Error):
        state = f"{psutil.Process(pid).status()}, in {Path(f'/proc/{pid}/wchan').read_text() or '?'}; "
    return f" [{state}its stdin {target} is also open in: {'; '.join(holders) or 'no other process'}]"


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def agent_processes(session_root: Path) -> list[tuple[int, str, int, str]]:
    """(depth, agent id, pid, which) for each live spawn.py and CLI of the tree."""
    found = []
    for d in sorted(session_root.glob("*/agents/*")):
        try:
            meta = load(d / "meta.json")
        except (OSError, ValueError):
            continue
        if (d / ".done").exists() or (d / ".fail").exists():
            continue
        found.append((meta["depth"], meta["id"], meta["pid"], "spawn.py"))
        with contextlib.suppress(OSError, ValueError, KeyError):
            found.append((meta["depth"], meta["id"], load(d / "heartbeat.json")["cli_pid"], "claude CLI"))
    return found


def check_records(session_root: Path, result: Trial) -> None:
    try:
        import jsonschema
    except ImportError:
        result.error = "jsonschema is not installed; run under `uvx nox -s soak`"
        return
    schemas = {p.stem: json.loads(p.read_text()) for p in SCHEMAS.glob("*.json")}

    def check(instance: Any, name: str, where: Path) -> None:
        try:
            jsonschema.Draft202012Validator(schemas[name]).validate(instance)
        except jsonschema.ValidationError as exc:
            result.invalid_records.append(f"{where}: {exc.message}")

    for d in sorted(session_root.glob("*/agents/*")):
        if not (d / "meta.json").exists():
            result.unregistered_dirs += 1  # a background launch killed before it registered
            continue
        result.agents += 1
        check(load(d / "meta.json"), "meta", d / "meta.json")
        markers = [m for m in (".done", ".fail") if (d / m).exists()]
        if not (d / "outcome.json").exists() or not markers:
            result.without_outcome.append(d.name)
        else:
            check(load(d / "outcome.json"), "outcome", d / "outcome.json")
        if len(markers) > 1:
            result.two_outcomes.append(d.name)
        if (d / "transcript.jsonl").exists():
            for line in (d / "transcript.jsonl").read_text().splitlines():
                check(json.loads(line), "transcript-line", d / "transcript.jsonl")


def run_trial(trial: int, seed: int, keep: bool) -> Trial:
    rng = random.Random(seed * 1_000_003 + trial)
    result = Trial(trial=trial, seed=seed)
    work = Path(tempfile.mkdtemp(prefix=f"spawn-soak-{trial}-"))
    tracker = Tracker()
    stack = contextlib.ExitStack()
    try:
        served = stack.enter_context(serve(work))
        session_root = work / "sessions"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE")) and k != "TRACEPARENT"}
        env.update(
            HOME=str(work),
            CLAUDE_CONFIG_DIR=str(work / ".claude"),
            ANTHROPIC_BASE_URL=served.url,
            ANTHROPIC_API_KEY="soak-test-key",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            SPAWN_SESSION_ROOT=str(session_root),
        )
        root = subprocess.Popen(
            [sys.executable, str(SPAWN), "--task", tree_task(trial), "--tools", "Bash,Read", "--timeout", str(TREE_TIMEOUT_S)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        kill_at = time.monotonic() + rng.uniform(0.5, 6.5)
        target = None
        while root.poll() is None:
            tracker.add_tree(root.pid)
            for _, _, pid, _ in agent_processes(session_root):
                tracker.add_tree(pid)  # the agent's guard is its child until it exits
            if target is None and time.monotonic() >= kill_at:
                candidates = agent_processes(session_root)
                if candidates:
                    level = rng.choice(sorted({depth for depth, *_ in candidates}))
                    depth, agent_id, pid, which = rng.choice([c for c in candidates if c[0] == level])
                    target = f"depth {depth} {agent_id} {which}"
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        target += " (already gone)"
            time.sleep(0.05)
        result.killed = target or "nothing (the tree ended first)"
        deadline = time.monotonic() + SURVIVOR_WINDOW_S
        while tracker.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        result.survivors = tracker.alive()
        # Guards and reapers may still be committing when the root returns.
        settle = time.monotonic() + SURVIVOR_WINDOW_S
        while time.monotonic() < settle:
            if all((d / ".done").exists() or (d / ".fail").exists() for d in session_root.glob("*/agents/*") if (d / "meta.json").exists()):
                break
            time.sleep(0.1)
        check_records(session_root, result)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for pid_info in tracker.alive():  # never leave a trial's processes behind
            pid = int(pid_info.split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stack.close()  # the scripted model
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200, help="how many trials (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="seed for kill times and targets (default 1)")
    parser.add_argument("--jobs", type=int, default=1, help="trials run at once (default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write every trial's result as JSON")
    parser.add_argument("--keep", action="store_true", help="keep each trial's session directory")
    args = parser.parse_args()
    started = time.monotonic()
    results: list[Trial] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_trial, n, args.seed, args.keep) for n in range(args.trials)]
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            results.append(r)
            mark = "ok" if r.clean else "FAIL"
            print(f"trial {r.trial:4d} {mark:4}  agents {r.agents}  killed {r.killed}", file=sys.stderr, flush=True)
            if not r.clean:
                print(f"           {json.dumps(asdict(r))}", file=sys.stderr, flush=True)
    results.sort(key=lambda r: r.trial)
    totals = {
        "trials_run": len(results),
        "clean_trials": sum(r.clean for r in results),
        "agents_registered": sum(r.agents for r in results),
        "survivors_found": sum(len(r.survivors) for r in results),
        "agents_without_outcome": sum(len(r.without_outcome) for r in results),
        "agents_with_two_outcomes": sum(len(r.two_outcomes) for r in results),
        "invalid_records": sum(len(r.invalid_records) for r in results),
        "unregistered_launches": sum(r.unregistered_dirs for r in results),
        "trial_errors": sum(bool(r.error) for r in results),
        "seed": args.seed,
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"totals": totals, "trials": [asdict(r) for r in results]}, indent=2))
    width = max(len(k) for k in totals)
    for key, value in totals.items():
        print(f"{key:<{width}}  {value}")
    return 0 if totals["clean_trials"] == totals["trials_run"] else 1


if __name__ == "__main__":
    sys.exit(main())
