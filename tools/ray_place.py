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
retried or restarted), gets the agent's limits signed as a claim for that node
(it signs them itself at a tree's first placed level, with the tree's key,
which it gives the actor; below a placed agent, that agent's actor mints the
claim: run_standin), and reports where it landed (one JSON line on its stdout,
which the launcher writes into meta.json's ``placement``). The actor checks
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
# spawn.py passes a deadline of its own (--place-by), always before its own
# limit, so that this side gives up first and says why.
PLACE_TIMEOUT_S = 90.0
# SPAWN_RAY_AGENT_MEMORY: what Ray reserves per agent, in bytes, when one agent takes more (or less) than the default.
ENV_AGENT_MEMORY = "SPAWN_RAY_AGENT_MEMORY"
# Ray's own rewrites of a driver's runtime_env, switched off before `import ray`.
# Its uv integration (on by default) finds a `uv run` among the driver's
# ancestors (the user's `uv run spawn.py`, or the `uv run --script` that runs
# this file) and makes every worker run `uv run ... python` inside an upload of
# the launcher's working folder: no worker starts on any node, and the actor
# stays pending for ever. A runtime_env hook or an injected job config would
# rewrite it as silently. The runtime_env is connect()'s, and only that.
RAY_SETTINGS = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_task_oom_retries": "0"}  # OOM retries: their own counter, infinite by default
RAY_REWRITERS = ("RAY_RUNTIME_ENV_HOOK", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_OVERRIDE_JOB_RUNTIME_ENV")
# spawn.py's own deadline code ends the agent first; the actor is a backstop
# this long after the deadline (spawn.py's kill grace plus a margin).
DEADLINE_BACKSTOP_S = 30.0
# A kill: `spawn.py kill` on the node gets this long before the actor is killed by force.
KILL_GRACE_S = 20.0
# Ray's GCS counts a node dead after its health checks fail (5 checks 3 s apart by default).
NODE_VERDICT_S = 20.0
PR_SET_PDEATHSIG = 1
EXIT_REFUSED = 4  # spawn.py's ExitCode.REFUSED: limits refused, no model request made
EXIT_LOST = 1
ENV_MINT = "SPAWN_RAY_MINT"  # the host actor's mint socket, in its agent's runner's environment
NAMESPACE = "spawn"  # Ray's namespace for spawn.py's actors
MINT_READ_S = 10.0
ENV_STANDIN = "SPAWN_RAY_STANDIN"  # the stand-in's pid, which the placed runner's meta.json names
META = "meta.json"
RUNNER_LOG = "runner.log"
# The stand-in's last word, when it ends without its runner's outcome (the node
# lost, the claim refused, the deadline backstop): spawn.py's reaper quotes it,
# and tells a stand-in that died on the launcher's host (no word) from a lost node.
STANDIN_EXIT = "standin-exit.json"
STARTED = time.monotonic()


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


def ancestors(pid: int) -> list[int]:
    """pid and the pids above it, read from /proc (this node's, where the peer runs)."""
    chain = []
    while pid > 1 and pid not in chain:
        chain.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain


def asked_limits(meta: dict[str, Any]) -> dict[str, Any]:
    """What a child's meta.json asks for, in narrow_claim's terms."""
    permissions = meta.get("permissions") or {}
    asked: dict[str, Any] = {
        "tools": tuple(meta.get("tools") or ()),
        "deny": tuple(permissions.get("deny") or ()),
        "ask": tuple(permissions.get("ask") or ()),
        "permission_mode": str(meta.get("permission_mode") or "dontAsk"),
        "max_depth": int(meta.get("max_depth") or 0),
    }
    for key, name in (("deadline", "deadline"), ("max_budget_usd", "budget_hold_usd")):
        if meta.get(key) is not None:
            asked[name] = float(meta[key])
    return asked


class Minting:
    """A host actor's mint socket: a private Unix socket its agent's stand-ins ask for their claims on.

    The kernel names the asking process (SO_PEERCRED); the actor mints only for
    a process in its own agent's process tree (AgentHost.mint).
    """

    def __init__(self, host: AgentHost) -> None:
        import socket
        import tempfile

        self.host = host
        self.folder = tempfile.mkdtemp(prefix="spawn-mint-")  # 0700: only this user reaches the socket
        self.path = Path(self.folder) / "mint.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(16)
        self.open = True
        threading.Thread(target=self.serve, name="spawn-mint", daemon=True).start()

    def serve(self) -> None:
        import socket
        import struct

        while self.open:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(MINT_READ_S)
                    peer = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                    line = conn.makefile("rb").readline(1 << 20)
                    request = json.loads(line)
                    reply = self.host.mint(peer, request) if isinstance(request, dict) else {"refused": "not a request"}
                except (OSError, ValueError) as exc:
                    reply = {"refused": f"not a request: {exc}"[:300]}
                with contextlib.suppress(OSError):
                    conn.sendall((json.dumps(reply) + "\n").encode())

    def close(self) -> None:
        self.open = False
        with contextlib.suppress(OSError):
            self.sock.close()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def ask_for_claim(socket_path: str, request: dict[str, Any]) -> dict[str, Any]:
    """The parent's host actor's answer to a stand-in's request for its agent's claim."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(PLACE_TIMEOUT_S)
        client.connect(socket_path)
        client.sendall((json.dumps(request) + "\n").encode())
        answer = json.loads(client.makefile("rb").readline(1 << 20) or b"null")
    return answer if isinstance(answer, dict) else {"refused": "no answer"}


class AgentHost:
    """The Ray actor that runs one placed agent's spawn.py runner on its node.

    Threaded (max_concurrency): `kill` and `where` are answered while `run`
    blocks on the runner. It starts at most one agent, so a claim replayed to
    it is refused, and its replay cache refuses a nonce seen twice.
    """

    def __init__(self, public_pem: str | None) -> None:
        from cryptography.hazmat.primitives import serialization

        self.public_key: Any = serialization.load_pem_public_key(public_pem.encode()) if public_pem else None
        self.tree_key: Any = None
        """The tree's signing key, in this actor's memory only: it mints the claims of its agent's children."""
        self.adopted: spawn_claims.Claim | None = None
        """The claim a parent's actor minted for this one's agent (adopt), checked on arrival."""
        self.claim: spawn_claims.Claim | None = None
        self.replay = spawn_claims.ReplayCache()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def hold_key(self, raw_key: bytes) -> None:
        """Take the tree's signing key (from the stand-in that made it): this actor's agent may have children."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.tree_key = Ed25519PrivateKey.from_private_bytes(raw_key)
        self.public_key = self.tree_key.public_key()

    def adopt(self, raw_key: bytes, claim_text: str, signature: str) -> dict[str, Any]:
        """A parent's actor hands over the tree key and the claim it minted for this actor's agent: checked here, kept."""
        import ray  # type: ignore[import-not-found, unused-ignore]

        self.hold_key(raw_key)
        node = ray.get_runtime_context().get_node_id()
        try:
            self.adopted = spawn_claims.verify_claim(claim_text, signature, self.public_key, audience=node, replay=self.replay)
        except spawn_claims.ClaimError as exc:
            return {"refused": str(exc)}
        return {"adopted": self.adopted.child}

    def where(self) -> dict[str, Any]:
        import ray  # type: ignore[import-not-found, unused-ignore]

        context = ray.get_runtime_context()
        node = {"node_id": context.get_node_id(), "host": os.uname().nodename, "boot_id": boot_id()}
        return node | {"python": sys.executable, "runtime_env": context.get_runtime_env_string()}

    def run(
        self, claim_text: str | None, signature: str | None, argv: list[str], environ: dict[str, str], agent_dir: str
    ) -> dict[str, Any]:
        """Check the claim, start the runner, wait for it: {exit_code} or {refused: why}."""
        import ray  # type: ignore[import-not-found, unused-ignore]

        node = ray.get_runtime_context().get_node_id()
        try:
            if claim_text is None and self.adopted is not None:
                claim = self.adopted  # verified (and its nonce spent) when it was adopted
            elif self.public_key is None:
                raise spawn_claims.ClaimError("no claim: no key to check one with, and none was adopted")
            else:
                claim = spawn_claims.verify_claim(claim_text, signature, self.public_key, audience=node, replay=self.replay)
            if claim.child != Path(agent_dir).name:
                raise spawn_claims.ClaimError(f"the claim is for agent {claim.child}, not {Path(agent_dir).name}")
        except spawn_claims.ClaimError as exc:
            return {"refused": str(exc)}
        with self.lock:
            if self.proc is not None:
                return {"refused": "this host actor runs an agent already (a claim replayed)"}
            self.claim = claim  # what its children's claims are narrowed from (mint)
            env = claim_environment(claim, environ)
            env.pop(ENV_MINT, None)  # the parent's: this agent's children ask this actor
            minting = Minting(self) if self.tree_key is not None else None
            if minting is not None:
                env[ENV_MINT] = str(minting.path)
            with open(Path(agent_dir) / RUNNER_LOG, "ab") as log:
                # Started from this thread, which waits below for as long as the
                # runner lives: the death signal follows the thread, not the process.
                self.proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=environ.get("PWD") if environ.get("PWD") and Path(environ["PWD"]).is_dir() else None,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only; no locks taken between fork and exec)
                )
        deadline = claim.deadline
        try:
            while True:
                try:
                    return {"exit_code": self.proc.wait(timeout=1.0)}
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.time() > deadline + DEADLINE_BACKSTOP_S:
                        self.end_group(signal.SIGKILL)  # spawn.py's own deadline code did not end it
        finally:
            if minting is not None:
                minting.close()

    def mint(self, peer: int, request: dict[str, Any]) -> dict[str, Any]:
        """A child's claim, for a stand-in in this actor's agent's process tree: the least of this claim and what is asked.

        It goes to the child's own host actor (named in the request) with the
        tree key; the stand-in gets the claim's text only, to log.
        """
        import ray  # type: ignore[import-not-found, unused-ignore]

        parent, proc = self.claim, self.proc
        if parent is None or proc is None or self.tree_key is None:
            return {"refused": "this host actor runs no agent"}
        if proc.pid not in ancestors(peer):
            return {"refused": f"process {peer} is not in agent {parent.child}'s process tree"}
        asked = request.get("asked")
        if not isinstance(asked, dict) or asked.get("parent_id") != parent.child:
            return {"refused": f"the child asked for is not agent {parent.child}'s"}
        try:
            claim = spawn_claims.narrow_claim(
                parent, child=str(asked.get("id")), audience=str(request.get("audience")), asked=asked_limits(asked)
            )
        except spawn_claims.ClaimError as exc:
            return {"refused": str(exc)}
        text, signature = spawn_claims.sign_claim(claim, self.tree_key)
        raw = raw_key(self.tree_key)
        try:
            child_host = ray.get_actor(str(request.get("actor")), namespace=NAMESPACE)
            adopted = ray.get(child_host.adopt.remote(raw, text, signature), timeout=PLACE_TIMEOUT_S)
        except Exception as exc:  # no such actor, or it died
            return {"refused": f"the child's host actor can't take its claim: {type(exc).__name__}: {exc}"[:500]}
        return {"claim": text} if "adopted" in adopted else adopted

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


def ray_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment Ray is imported in: none of its runtime_env rewriters, its uv integration off, no OOM retries."""
    env = {name: value for name, value in environ.items() if name not in RAY_REWRITERS}
    return env | RAY_SETTINGS


def runtime_env() -> dict[str, Any]:
    """The job's whole runtime_env: env_vars only.

    No py_executable, so every worker runs its node's own Python (the one its
    `ray start` runs, which has Ray); no working_dir or py_modules, so nothing
    of the launcher's folder is ever uploaded. The host actor's worker imports
    spawn_claims from beside this script, a path every node shares.
    """
    return {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}}


def progress(message: str) -> None:
    """One line in the agent's runner.log (fd 2 points there): what the placement did, and when."""
    print(f"ray_place: {time.monotonic() - STARTED:.1f}s: {message}", file=sys.stderr, flush=True)


def connect(address: str) -> None:
    environ = ray_environment(dict(os.environ))
    os.environ.clear()
    os.environ.update(environ)
    import ray  # type: ignore[import-not-found, unused-ignore]

    ray.init(address=address, log_to_driver=False, configure_logging=False, namespace=NAMESPACE, runtime_env=runtime_env())
    python = f"Python {sys.version.split()[0]} ({sys.executable})"
    # A driver hangs on a node of its own host (the head, where there is one): if that node dies, so does this process.
    driver_node = ray.get_runtime_context().get_node_id()
    progress(f"connected to {address} as a driver on node {driver_node}: Ray {ray.__version__}, {python}")
    progress(f"runtime_env: {json.dumps(dict(ray.get_runtime_context().runtime_env), sort_keys=True)}")


def agent_memory(environ: dict[str, str]) -> int:
    """The memory Ray reserves per placed agent: SPAWN_RAY_AGENT_MEMORY bytes, else about one claude CLI's."""
    try:
        return max(1, int(environ.get(ENV_AGENT_MEMORY, "")))
    except ValueError:
        return AGENT_MEMORY_BYTES


def actor_state(ray: Any, host: Any) -> tuple[str, str | None]:
    """The actor's state in Ray's GCS (PENDING_CREATION, ...) and the node it was leased on, if any."""
    try:
        info = ray._private.state.actors(actor_id=host._actor_id.hex())
    except Exception as exc:  # the GCS unreachable: say so rather than guess
        return f"of unknown state ({type(exc).__name__})", None
    node = str((info.get("Address") or {}).get("NodeID") or "")
    return str(info.get("State") or "unknown"), node if set(node) - {"0", "f"} else None  # a nil id is all f (or empty)


def not_placed_reason(name: str, state: str, node: str | None, waited: float, memory: int) -> str:
    """Why an actor was not placed in time, and where to look."""
    where = f" on node {node}" if node and state != "PENDING_CREATION" else ""
    return (
        f"actor {name} still {state}{where} after {waited:.0f} s: Ray could not start its worker, or no node has "
        f"{memory / 2**20:.0f} MiB of Ray memory free (`ray status`); see the nodes' raylet*.err and "
        f"python-core-worker-*.log in their Ray logs folder (TEMP_DIR/session_latest/logs; /tmp/ray by default)"
    )


def last_word(agent_dir: Path, exit_code: int, reason: str) -> None:
    """Leave the stand-in's reason for ending without an outcome where spawn.py's reaper reads it (atomically)."""
    tmp = agent_dir / f".{STANDIN_EXIT}.{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"exit_code": exit_code, "reason": reason, "pid": os.getpid()}) + "\n")
        os.replace(tmp, agent_dir / STANDIN_EXIT)


def wait_for_meta(agent_dir: Path, limit: float) -> dict[str, Any]:
    while time.monotonic() < limit:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((agent_dir / META).read_text())
            if isinstance(data, dict):
                return data
        time.sleep(0.02)
    raise TimeoutError(f"{agent_dir / META} was never written")


def claim_for(meta: dict[str, Any], node_id: str) -> spawn_claims.Claim:
    """A tree's first placed agent's claim: the limits its meta.json holds (asked_limits), for its node."""
    limits = {"deadline": None, "budget_hold_usd": None, **asked_limits(meta)}
    session, parent, child, depth = Path(str(meta["session"])).name, meta.get("parent_id"), str(meta["id"]), int(meta["depth"])
    return spawn_claims.Claim(session=session, parent=parent, child=child, audience=node_id, depth=depth, **limits)


def run_standin(address: str, agent_dir: Path, spawn_argv: list[str], asked: dict[str, Any] | None, place_by: float) -> int:
    """The stand-in: place the host actor, get its claim, report where, run, and turn a SIGTERM into the kill path.

    The first placed level of a tree makes the tree's key (in memory only),
    signs its agent's claim, and gives the key to its host actor. Below a placed
    agent ($SPAWN_RAY_MINT in the environment), that agent's host actor mints
    the claim, the least of its own and what is asked, and hands it with the key
    to this agent's actor: asked while this stand-in's launcher, in the parent's
    process tree, still waits for the placement line. Each step goes to
    runner.log; a placement not done by place_by (before the launcher's own
    limit) ends with the actor's state and where to look.
    """
    report = quiet_stdout(agent_dir)
    progress(f"stand-in {os.getpid()} placing agent {agent_dir.name} on {address}")
    try:
        connect(address)
        host, name, where, key = place(address, agent_dir, asked, place_by)
    except Exception as exc:  # a placement that never happens: GetTimeoutError, a dead actor, no cluster
        reason = str(exc) if isinstance(exc, NotPlaced) else f"{type(exc).__name__}: {exc}"
        progress(f"not placed on {address}: {reason}")
        os.write(report, (json.dumps({"error": reason}) + "\n").encode())
        return EXIT_LOST
    # Our pid, not our parent's: under `uv run --script` the launcher's child is uv.
    os.write(report, (json.dumps({"backend": "ray", **where, "pid": os.getpid()}) + "\n").encode())
    os.close(report)  # the launcher reads one line; from here on, nothing of ours reaches its stdout
    import ray  # type: ignore[import-not-found, unused-ignore]

    meta = wait_for_meta(agent_dir, time.monotonic() + PLACE_TIMEOUT_S)
    stopping = Stopping()
    signal.signal(signal.SIGTERM, stopping.set)
    signal.signal(signal.SIGINT, stopping.set)
    environ = {**os.environ, ENV_STANDIN: str(os.getpid())}
    claim_text, signature = spawn_claims.sign_claim(claim_for(meta, str(where["node_id"])), key) if key is not None else (None, None)
    ref = host.run.remote(claim_text, signature, [*spawn_argv, "_run", str(agent_dir)], environ, str(agent_dir))
    progress(f"runner started by actor {name}")
    code, why = follow(Placed(ray, host, ref, meta, spawn_argv, environ, where), stopping)
    if why is not None:
        progress(why)
        last_word(agent_dir, code, why)
    return code


class NotPlaced(Exception):
    """The actor was not placed by the stand-in's deadline: its state, and where to look."""


def place(address: str, agent_dir: Path, asked: dict[str, Any] | None, place_by: float) -> tuple[Any, str, dict[str, Any], Any]:
    """Ask Ray for the agent's host actor and wait until it is placed: (its handle, its name, where, the tree key or None)."""
    import secrets

    import ray  # type: ignore[import-not-found, unused-ignore]

    mint = os.environ.get(ENV_MINT)
    key = None if mint else spawn_claims.new_tree_key()
    name = f"host-{agent_dir.name}-{secrets.token_hex(4)}"
    memory = agent_memory(dict(os.environ))
    options = {"num_cpus": 0, "memory": memory, "scheduling_strategy": "SPREAD", "max_concurrency": 4}
    options |= {"name": name, "max_restarts": 0, "max_task_retries": 0}  # running an agent again is spawn.py's decision
    asked_at = time.monotonic()
    host = ray.remote(AgentHost).options(**options).remote(None if key is None else spawn_claims.public_key_text(key))
    progress(f"actor {name} requested: memory {memory / 2**20:.0f} MiB, num_cpus 0, SPREAD; waiting up to {place_by - time.time():.0f} s")
    try:
        where = ray.get(host.where.remote(), timeout=max(0.1, place_by - time.time()))
    except ray.exceptions.GetTimeoutError:
        state, node = actor_state(ray, host)
        with contextlib.suppress(Exception):
            ray.kill(host, no_restart=True)  # else the raylet retries its worker for ever
        raise NotPlaced(not_placed_reason(name, state, node, time.monotonic() - asked_at, memory)) from None
    python, env = where.pop("python", None), where.pop("runtime_env", None)
    took = time.monotonic() - asked_at
    progress(f"placed on node {where['node_id']} (host {where['host']}) in {took:.1f} s; worker: {python}, runtime_env {env}")
    if key is not None:
        ray.get(host.hold_key.remote(raw_key(key)), timeout=max(0.1, place_by - time.time()))
    elif asked is not None and mint is not None:
        minted = ask_for_claim(mint, {"asked": asked, "audience": where["node_id"], "actor": name})
        if "refused" in minted:  # the actor has no claim, so the node refuses the agent (exit 4)
            progress(f"no claim for agent {agent_dir.name}: {minted['refused']}")
        else:
            progress(f"agent {agent_dir.name}'s claim was minted by its parent's host actor")
    return host, name, where, key


def raw_key(key: Any) -> bytes:
    """The private key's 32 bytes, to hand to a host actor over Ray (never written anywhere)."""
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()))


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


def node_alive(ray: Any, node_id: str) -> bool | None:
    """Whether Ray's GCS still counts the node alive (None: it can't say)."""
    try:
        return any(node.get("NodeID") == node_id and bool(node.get("Alive")) for node in ray.nodes())
    except Exception:
        return None


def actor_died_reason(ray: Any, where: dict[str, Any], exc: BaseException) -> str:
    """Why the host actor died: its node lost (the GCS counts it dead), or the actor alone.

    The GCS may learn of a node's death a few health checks after its actor's
    caller does: it is asked again for up to NODE_VERDICT_S.
    """
    node = f"{where['node_id']} (host {where['host']})"
    detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    limit = time.monotonic() + NODE_VERDICT_S
    while (alive := node_alive(ray, str(where["node_id"]))) and time.monotonic() < limit:
        time.sleep(1.0)
    if alive is False:
        return f"the Ray node {node} running it was lost: {detail}"
    return f"its host actor on the Ray node {node} died: {detail}"


def follow(placed: Placed, stopping: Stopping) -> tuple[int, str | None]:
    """Wait for the placed runner; a kill, a dead node or a deadline each ends it one way only.

    The exit code, and why, when it ended without its runner's outcome.
    """
    ray, meta, where = placed.ray, placed.meta, placed.where
    deadline = meta.get("deadline")
    while True:
        ready, _ = ray.wait([placed.ref], timeout=0.5)
        if ready:
            try:
                result = ray.get(placed.ref)
            except ray.exceptions.RayActorError as exc:
                return EXIT_LOST, actor_died_reason(ray, where, exc)
            if "refused" in result:
                return EXIT_REFUSED, f"the Ray node {where['node_id']} refused it: {result['refused']}"
            return int(result["exit_code"]), None
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
            if stopping.is_set():
                return (130 if interrupted else 143), None
            return EXIT_LOST, f"its runner on the Ray node {where['node_id']} outlived its deadline by {DEADLINE_BACKSTOP_S:.0f} s"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ray_place.py", description="Run a spawn.py agent on a Ray cluster (started by spawn.py).")
    sub = p.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="stand in for AGENT_DIR's runner and run it on the cluster")
    run.add_argument("--address", required=True, help="the Ray cluster (ray:ADDRESS's address)")
    run.add_argument("--spawn", nargs="+", required=True, metavar="ARG", help="how the node runs spawn.py: PYTHON SPAWN_PY")
    run.add_argument("--place-by", type=float, help="give up placing at this time (Unix seconds): spawn.py's limit, less a margin")
    run.add_argument("agent_dir")
    args = p.parse_args(argv)
    agent_dir = Path(args.agent_dir)
    if not agent_dir.is_dir():
        print(f"ray_place: error: {agent_dir} is not an agent directory", file=sys.stderr)
        return 2
    # The launcher writes the agent's meta.json-to-be on stdin, and closes it.
    text = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    try:
        asked = json.loads(text) if text.strip() else None
    except ValueError:
        asked = None
    place_by = args.place_by if args.place_by is not None else time.time() + PLACE_TIMEOUT_S
    return run_standin(args.address, agent_dir, list(args.spawn), asked if isinstance(asked, dict) else None, place_by)


if __name__ == "__main__":
    sys.exit(main())
