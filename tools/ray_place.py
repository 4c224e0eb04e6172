#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["ray==2.60.0", "cryptography>=44"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py's agents placed on a Ray cluster: the stand-in runner and the host actor.

spawn.py never imports Ray. When an agent's placement is ``ray:ADDRESS``,
its launcher starts this script instead of its own runner::

    ray_place.py run --address ADDRESS AGENT_DIR

This process (the *stand-in*) is the agent's process on the launcher's host:
meta.json names it, so status, wait and kill there watch and stop it as any
runner. It connects to the cluster as a Ray driver, has Ray place one *host
actor* for the agent (about one claude CLI's memory, spread over nodes, never
retried or restarted), reports where it landed (one JSON line on its stdout,
which the launcher writes into meta.json's ``placement``), signs the agent's
limits as a claim for that node, and hands it to the actor. The actor checks
the claim and starts spawn.py's own runner (``spawn.py _run AGENT_DIR``) on
its node, in a session of its own, with a death signal tied to the actor;
that runner does everything a local one does (deadline, heartbeat, outcome)
in the shared session directory.

What Ray prints never reaches a spawn.py stdout: the driver runs with
``log_to_driver=False`` and its fd 1 and 2 point at the agent's runner log.

Running an agent again is spawn.py's decision (``--resume``), never Ray's:
``max_restarts=0``, ``max_task_retries=0``, and ``RAY_task_oom_retries=0``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spawn_claims

# About one claude CLI with its node runtime (~200 MB measured) plus spawn.py's
# runner and guard: what Ray reserves per agent, so a node takes only as many
# agents as its memory holds (Ray's `memory` resource, in bytes).
AGENT_MEMORY_BYTES = 256 * 1024 * 1024
# Ray needs a few seconds to start an actor's worker on a busy node; past this
# the agent is refused rather than left queued forever (a node may have died).
PLACE_TIMEOUT_S = 120.0
# spawn.py's own deadline code ends the agent first; the actor is a backstop
# this long after the deadline (spawn.py's kill grace plus a margin).
DEADLINE_BACKSTOP_S = 30.0
# A kill: `spawn.py kill` on the node gets this long before the actor is killed by force.
KILL_GRACE_S = 20.0
PR_SET_PDEATHSIG = 1
EXIT_REFUSED = 4  # spawn.py's ExitCode.REFUSED: limits refused, no model request made
EXIT_LOST = 1
ENV_STANDIN = "SPAWN_RAY_STANDIN"  # the stand-in's pid, which the placed runner's meta.json names
META = "meta.json"
RUNNER_LOG = "runner.log"


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it (the actor's) ends; no signal blocked.

    A Ray worker's threads may block signals, and a child inherits its
    thread's mask across exec: the runner must see the SIGINT of an interrupt.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def claim_environment(claim: spawn_claims.Claim, environ: dict[str, str]) -> dict[str, str]:
    """The runner's environment with the parent's limits taken from the verified claim, never from what was sent."""
    env = dict(environ)
    if claim.parent is None:  # a root: no parent limits to take from anywhere
        for name in ("SPAWN_DEPTH", "SPAWN_MAX_DEPTH", "SPAWN_PERMISSION_MODE", "SPAWN_DENY", "SPAWN_ASK", "SPAWN_DEADLINE"):
            env.pop(name, None)
        env.pop("SPAWN_MAX_BUDGET_USD", None)
        return env
    env["SPAWN_DEPTH"] = str(claim.depth - 1)
    env["SPAWN_MAX_DEPTH"] = str(claim.max_depth)
    env["SPAWN_PERMISSION_MODE"] = claim.permission_mode
    env["SPAWN_DENY"] = json.dumps(list(claim.deny))
    env["SPAWN_ASK"] = json.dumps(list(claim.ask))
    for name, value in (("SPAWN_DEADLINE", claim.deadline), ("SPAWN_MAX_BUDGET_USD", claim.budget_hold_usd)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = repr(float(value))
    return env


class AgentHost:
    """The Ray actor that runs one placed agent's spawn.py runner on its node.

    Threaded (max_concurrency): `kill` and `where` are answered while `run`
    blocks on the runner. It starts at most one agent, so a claim replayed to
    it is refused, and its replay cache refuses a nonce seen twice.
    """

    def __init__(self, public_pem: str) -> None:
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_public_key(public_pem.encode())
        self.public_key: Any = key
        self.replay = spawn_claims.ReplayCache()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def where(self) -> dict[str, Any]:
        import ray  # type: ignore[import-not-found, unused-ignore]

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": os.uname().nodename, "boot_id": boot_id()}

    def run(
        self, claim_text: str | None, signature: str | None, argv: list[str], environ: dict[str, str], agent_dir: str
    ) -> dict[str, Any]:
        """Check the claim, start the runner, wait for it: {exit_code} or {refused: why}."""
        import ray  # type: ignore[import-not-found, unused-ignore]

        node = ray.get_runtime_context().get_node_id()
        try:
            claim = spawn_claims.verify_claim(claim_text, signature, self.public_key, audience=node, replay=self.replay)
            if claim.child != Path(agent_dir).name:
                raise spawn_claims.ClaimError(f"the claim is for agent {claim.child}, not {Path(agent_dir).name}")
        except spawn_claims.ClaimError as exc:
            return {"refused": str(exc)}
        with self.lock:
            if self.proc is not None:
                return {"refused": "this host actor runs an agent already (a claim replayed)"}
            with open(Path(agent_dir) / RUNNER_LOG, "ab") as log:
                # Started from this thread, which waits below for as long as the
                # runner lives: the death signal follows the thread, not the process.
                self.proc = subprocess.Popen(
                    argv,
                    env=claim_environment(claim, environ),
                    cwd=environ.get("PWD") if environ.get("PWD") and Path(environ["PWD"]).is_dir() else None,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only; no locks taken between fork and exec)
                )
        deadline = claim.deadline
        while True:
            try:
                return {"exit_code": self.proc.wait(timeout=1.0)}
            except subprocess.TimeoutExpired:
                if deadline is not None and time.time() > deadline + DEADLINE_BACKSTOP_S:
                    self.end_group(signal.SIGKILL)  # spawn.py's own deadline code did not end it

    def kill(self, spawn_argv: list[str], environ: dict[str, str], agent_id: str, session: str) -> int:
        """`spawn.py kill` for the agent, on this node: its runner records `killed` and ends its subtree."""
        try:
            done = subprocess.run(
                [*spawn_argv, "kill", "--session", session, agent_id],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=KILL_GRACE_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return -1
        return done.returncode

    def interrupt(self) -> bool:
        """SIGINT to the runner, as a terminal's Ctrl-C to a local agent: it ends its subtree and records `interrupted`."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.proc.pid, signal.SIGINT)
        return True

    def end_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)


# ------------------------------------------------------------------ driver --


def quiet_stdout(agent_dir: Path) -> int:
    """Point fd 1 and 2 at the agent's runner log; return a dup of the original stdout (for the one report line).

    Ray and its C++ core write to fd 1 when a node dies, whatever
    log_to_driver says: at the fd level nothing of it can reach a pipe a
    spawn.py parent reads.
    """
    report = os.dup(1)
    log = os.open(agent_dir / RUNNER_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    return report


def connect(address: str) -> None:
    os.environ["RAY_task_oom_retries"] = "0"  # noqa: SIM112 (Ray's name, case-sensitive). Ray's OOM retries have their own counter, infinite by default
    import ray  # type: ignore[import-not-found, unused-ignore]

    # The host actor's worker imports spawn_claims from beside this script (a path shared by every node).
    runtime_env = {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}}
    ray.init(address=address, log_to_driver=False, configure_logging=False, namespace="spawn", runtime_env=runtime_env)


def wait_for_meta(agent_dir: Path, limit: float) -> dict[str, Any]:
    while time.monotonic() < limit:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((agent_dir / META).read_text())
            if isinstance(data, dict):
                return data
        time.sleep(0.02)
    raise TimeoutError(f"{agent_dir / META} was never written")


def claim_for(meta: dict[str, Any], node_id: str) -> spawn_claims.Claim:
    permissions = meta.get("permissions") or {}
    return spawn_claims.Claim(
        session=Path(str(meta["session"])).name,
        parent=meta.get("parent_id"),
        child=str(meta["id"]),
        audience=node_id,
        depth=int(meta["depth"]),
        max_depth=int(meta["max_depth"]),
        deadline=meta.get("deadline"),
        budget_hold_usd=meta.get("max_budget_usd"),
        tools=tuple(meta.get("tools") or ()),
        deny=tuple(permissions.get("deny") or ()),
        ask=tuple(permissions.get("ask") or ()),
        permission_mode=str(meta.get("permission_mode") or "dontAsk"),
    )


def run_standin(address: str, agent_dir: Path, spawn_argv: list[str]) -> int:
    """The stand-in: place the host actor, report where, sign, run, and turn a SIGTERM into the kill path."""
    report = quiet_stdout(agent_dir)
    connect(address)
    import ray  # type: ignore[import-not-found, unused-ignore]

    key = spawn_claims.new_tree_key()  # in this process's memory only; the actor gets the public half
    host_cls = ray.remote(AgentHost)
    host = host_cls.options(
        num_cpus=0,
        memory=AGENT_MEMORY_BYTES,
        scheduling_strategy="SPREAD",
        max_restarts=0,
        max_task_retries=0,
        max_concurrency=4,
    ).remote(spawn_claims.public_key_text(key))
    try:
        where = ray.get(host.where.remote(), timeout=PLACE_TIMEOUT_S)
    except Exception as exc:  # a placement that never happens: GetTimeoutError, a dead actor
        os.write(report, (json.dumps({"error": f"not placed on {address}: {type(exc).__name__}: {exc}"}) + "\n").encode())
        return EXIT_LOST
    os.write(report, (json.dumps({"backend": "ray", **where}) + "\n").encode())
    os.close(report)  # the launcher reads one line; from here on, nothing of ours reaches its stdout
    meta = wait_for_meta(agent_dir, time.monotonic() + PLACE_TIMEOUT_S)
    stopping = Stopping()
    signal.signal(signal.SIGTERM, stopping.set)
    signal.signal(signal.SIGINT, stopping.set)
    environ = {**os.environ, ENV_STANDIN: str(os.getpid())}
    claim_text, signature = spawn_claims.sign_claim(claim_for(meta, str(where["node_id"])), key)
    ref = host.run.remote(claim_text, signature, [*spawn_argv, "_run", str(agent_dir)], environ, str(agent_dir))
    return follow(Placed(ray, host, ref, meta, spawn_argv, environ, where), stopping)


class Stopping(threading.Event):
    """Set by a stop signal; the first one is kept: SIGINT interrupts the agent, SIGTERM kills it."""

    signum: int | None = None

    def set(self, signum: int | None = None, _frame: Any = None) -> None:
        if self.signum is None:
            self.signum = signum
        super().set()


@dataclass
class Placed:
    """One placed agent, as the stand-in follows it."""

    ray: Any
    host: Any
    """The AgentHost actor's handle."""
    ref: Any
    """Its `run` call."""
    meta: dict[str, Any]
    spawn_argv: list[str]
    environ: dict[str, str]
    where: dict[str, Any]


def follow(placed: Placed, stopping: Stopping) -> int:
    """Wait for the placed runner; a kill, a dead node or a deadline each ends it one way only."""
    ray, meta, where = placed.ray, placed.meta, placed.where
    deadline = meta.get("deadline")
    while True:
        ready, _ = ray.wait([placed.ref], timeout=0.5)
        if ready:
            try:
                result = ray.get(placed.ref)
            except ray.exceptions.RayActorError as exc:
                node = f"{where['node_id']} ({where['host']})"
                print(f"ray_place: the Ray node {node} running agent {meta['id']} was lost: {exc}", file=sys.stderr)
                return EXIT_LOST
            if "refused" in result:
                print(f"ray_place: node {where['node_id']} refused agent {meta['id']}: {result['refused']}", file=sys.stderr)
                return EXIT_REFUSED
            return int(result["exit_code"])
        late = deadline is not None and time.time() > float(deadline) + DEADLINE_BACKSTOP_S
        if stopping.is_set() or late:
            # The kill path: `spawn.py kill` on the node (the runner records
            # `killed` and ends its subtree), or a SIGINT passed on (`interrupted`),
            # then a forced end of the actor.
            interrupted = stopping.signum == signal.SIGINT
            if interrupted:
                stop = placed.host.interrupt.remote()
            else:
                stop = placed.host.kill.remote(placed.spawn_argv, placed.environ, str(meta["id"]), str(meta["session"]))
            with contextlib.suppress(Exception):
                ray.get(stop, timeout=KILL_GRACE_S)
            ready, _ = ray.wait([placed.ref], timeout=KILL_GRACE_S)
            if not ready:
                with contextlib.suppress(Exception):
                    ray.kill(placed.host, no_restart=True)
            return (130 if interrupted else 143) if stopping.is_set() else EXIT_LOST


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ray_place.py", description="Run a spawn.py agent on a Ray cluster (started by spawn.py).")
    sub = p.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="stand in for AGENT_DIR's runner and run it on the cluster")
    run.add_argument("--address", required=True, help="the Ray cluster (ray:ADDRESS's address)")
    run.add_argument("--spawn", nargs="+", required=True, metavar="ARG", help="how the node runs spawn.py: PYTHON SPAWN_PY")
    run.add_argument("agent_dir")
    args = p.parse_args(argv)
    agent_dir = Path(args.agent_dir)
    if not agent_dir.is_dir():
        print(f"ray_place: error: {agent_dir} is not an agent directory", file=sys.stderr)
        return 2
    return run_standin(args.address, agent_dir, list(args.spawn))


if __name__ == "__main__":
    sys.exit(main())
