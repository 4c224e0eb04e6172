#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["ray==2.60.0", "cryptography>=44"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""spawn.py's agents placed on a Ray cluster: the placement service and the host actors.

spawn.py never imports Ray. When an agent's placement is ``ray:ADDRESS``, its
launcher asks a *placement service* over a Unix socket instead of starting its
own runner. There is one service per session and launcher host, the only Ray
driver there (one ``ray.init``), started by the first launcher that needs it::

    ray_place.py serve --address ADDRESS --record SESSION/placement/KEY.json

For each agent the service reserves its memory with a one-bundle placement
group, asks that node's *host actor* (one per session and node, long-lived,
pinned to its node) to start spawn.py's own runner (``spawn.py _run
AGENT_DIR``) there, and starts a *token* on the launcher's host: a tiny shell
that is the agent's pid there (meta.json names it), so that status, wait and
kill there watch and stop it as any runner. A signal to the token reaches the
service as a line on a pipe (TERM: kill, INT: interrupt), and the service runs
the kill path on the node; the token ends when the agent has. One loop
(``ray.wait`` over every agent's run) supervises them all.

Limits travel as claims (tools/spawn_claims.py): the service signs a tree's
first placed agent's claim with a key of the tree's (in memory only), which it
hands to the host actor with the claim. A placed agent's own children ask its
node's host actor, on a socket named in the runner's environment
($SPAWN_RAY_PLACER): the actor mints their claims from its agent's (the least
of that and what is asked, for a process in the agent's tree only) and places
them in turn, so no driver starts anywhere below the root.

Placed agents end with the service: its host actors and placement groups are
its job's (never detached), so if it dies Ray ends them, their runners get
their death signal, its tokens see their pipe close and exit, and the reaper
on the launcher's host settles every agent.

What Ray prints never reaches a spawn.py stdout: the service's fd 1 and 2 are
its log. Running an agent again is spawn.py's decision (``--resume``), never
Ray's: ``max_restarts=0``, ``max_task_retries=0``, and ``RAY_task_oom_retries=0``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spawn_claims

# About one claude CLI with its node runtime (~200 MB measured) plus spawn.py's
# runner and guard: what Ray reserves per agent, so a node takes only as many
# agents as its memory holds (Ray's `memory` resource, in bytes).
AGENT_MEMORY_BYTES = 256 * 1024 * 1024
# Past this an agent is refused rather than left queued forever (a node may
# have died). spawn.py passes a deadline of its own, always before its own
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
# spawn.py's own deadline code ends the agent first; the host actor is a
# backstop this long after the deadline (spawn.py's kill grace plus a margin).
DEADLINE_BACKSTOP_S = 30.0
# A kill: `spawn.py kill` on the node gets this long before the runner's group is killed by force.
KILL_GRACE_S = 20.0
# Ray's GCS counts a node dead after its health checks fail (5 checks 3 s apart by default).
NODE_VERDICT_S = 20.0
# The service leaves this long after its last agent ended (no process outlives its tree for long).
IDLE_EXIT_S = 15.0
# How often the service looks for nodes that joined, to give each its host actor.
NODES_EVERY_S = 5.0
# One turn of the supervision loop: how soon a signal to a token or an ended run is seen.
SUPERVISE_TICK_S = 0.1
# Threads of a host actor: one per running agent, plus control calls (kill, interrupt, where).
HOST_CONCURRENCY = 1000
PR_SET_PDEATHSIG = 1
EXIT_REFUSED = 4  # spawn.py's ExitCode.REFUSED: limits refused, no model request made
EXIT_LOST = 1
ENV_PLACER = "SPAWN_RAY_PLACER"  # a host actor's placement socket, in its agents' runners' environment
PLACER_FOLDER_PREFIX = "spawn-place-"  # a placer's 0700 folder under the temp dir, holding its socket
PLACER_SOCKET = "place.sock"
PLACER_FOLDER_GRACE_S = 60.0  # a placer folder with no socket this long after it was made was abandoned
NAMESPACE = "spawn"  # Ray's namespace for spawn.py's actors
REQUEST_READ_S = 10.0
ENV_STANDIN = "SPAWN_RAY_STANDIN"  # the token's pid, which the placed runner's meta.json names
META = "meta.json"
RUNNER_LOG = "runner.log"
# The placing side's last word, when an agent ends without its runner's outcome
# (the node lost, the claim refused, the deadline backstop): spawn.py's reaper
# quotes it, and tells a token that died on the launcher's host (no word) from a lost node.
STANDIN_EXIT = "standin-exit.json"
# The token: a shell whose trapped signals become lines on its stdout (a pipe
# the service reads), kept alive by a `cat` of the service's pipe (which ignores
# them): it ends when the service closes that pipe, or dies. About 1 MiB PSS
# for the two processes, against ~100 MB for a Ray driver.
TOKEN_SCRIPT = (
    "exec 3<&0; trap 'echo INT' INT; trap 'echo TERM' TERM; trap 'echo HUP' HUP; "
    "(trap '' INT TERM HUP; exec cat <&3 >/dev/null) & c=$!; "
    "while :; do wait $c; [ $? -gt 128 ] && kill -0 $c 2>/dev/null && continue; exit 0; done"
)
STARTED = time.monotonic()


Minter = Callable[[str], "tuple[str, str, bytes] | str"]
"""Makes an agent's claim for its node (its audience): the claim's text, its signature and the tree key; or why not."""
Claimer = Callable[[int, dict[str, Any]], "Minter | str"]
"""Who may have this agent placed (the asking pid, the agent's meta.json to be): how its claim is made, or why not."""


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


def default_signals() -> None:
    """In the token before exec: TERM, INT and HUP at their defaults, none blocked.

    A shell can't trap a signal that was ignored when it started (POSIX), and
    a service started from a background job or under nohup inherits SIGINT
    ignored: its tokens would never say INT. libc's signal(), not Python's,
    which only the main thread may call.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        libc.signal(int(sig), 0)  # SIG_DFL
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


def agent_memory(environ: dict[str, str]) -> int:
    """The memory Ray reserves per placed agent: SPAWN_RAY_AGENT_MEMORY bytes, else about one claude CLI's."""
    try:
        return max(1, int(environ.get(ENV_AGENT_MEMORY, "")))
    except ValueError:
        return AGENT_MEMORY_BYTES


def last_word(agent_dir: Path, exit_code: int, reason: str) -> None:
    """Leave the placing side's reason for ending without an outcome where spawn.py's reaper reads it (atomically)."""
    tmp = agent_dir / f".{STANDIN_EXIT}.{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"exit_code": exit_code, "reason": reason, "pid": os.getpid()}) + "\n")
        os.replace(tmp, agent_dir / STANDIN_EXIT)


def claim_for(meta: dict[str, Any], node_id: str) -> spawn_claims.Claim:
    """A tree's first placed agent's claim: the limits its meta.json holds (asked_limits), for its node."""
    limits = {"deadline": None, "budget_hold_usd": None, **asked_limits(meta)}
    session, parent, child, depth = Path(str(meta["session"])).name, meta.get("parent_id"), str(meta["id"]), int(meta["depth"])
    return spawn_claims.Claim(session=session, parent=parent, child=child, audience=node_id, depth=depth, **limits)


def raw_key(key: Any) -> bytes:
    """The private key's 32 bytes, to hand to a host actor over Ray (never written anywhere)."""
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()))


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


def pg_state(pg: Any) -> str:
    """A placement group's state in Ray's GCS (PENDING, CREATED, ...), or what kept it from being read."""
    from ray.util import placement_group_table  # type: ignore[import-not-found, unused-ignore]

    try:
        return str(placement_group_table(pg).get("state") or "unknown")
    except Exception as exc:  # the GCS unreachable: say so rather than guess
        return f"of unknown state ({type(exc).__name__})"


def not_placed_reason(state: str, waited: float, memory: int) -> str:
    """Why an agent's placement group was not placed in time, and where to look."""
    return (
        f"its placement group still {state} after {waited:.0f} s: no node has {memory / 2**20:.0f} MiB of Ray memory "
        f"free (`ray status`), or the node's host actor could not start; see the nodes' raylet*.err and "
        f"python-core-worker-*.log in their Ray logs folder (TEMP_DIR/session_latest/logs; /tmp/ray by default)"
    )


class AgentLog:
    """Progress lines in one agent's runner.log: what its placement did, and when."""

    def __init__(self, agent_dir: Path) -> None:
        self.path = agent_dir / RUNNER_LOG

    def __call__(self, message: str) -> None:
        with contextlib.suppress(OSError), open(self.path, "a") as log:
            log.write(f"ray_place: {time.monotonic() - STARTED:.1f}s: {message}\n")


@dataclass
class Running:
    """One agent a host actor runs: the claim its children's are narrowed from, the tree's key, its runner."""

    claim: spawn_claims.Claim
    key: Any
    proc: subprocess.Popen[bytes]


class NodeHost:
    """The Ray actor that runs one session's placed agents on its node (one per session, launcher host and node).

    Threaded (max_concurrency): each `run` holds a thread while its runner
    lives, so `kill`, `interrupt` and `where` are answered meanwhile. An agent
    id runs once here, and the replay cache refuses a claim's nonce seen twice.
    Its agents' own children ask it to place them (its Placer, on a socket named
    in their runners' environment).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        """The names of this session's host actors (and this service's) start with it."""
        self.replay = spawn_claims.ReplayCache()
        self.agents: dict[str, Running] = {}
        self.ran: set[str] = set()
        self.lock = threading.Lock()
        self.placer: Placer | None = None

    def where(self) -> dict[str, Any]:
        import ray  # type: ignore[import-not-found, unused-ignore]

        context = ray.get_runtime_context()
        node = {"node_id": context.get_node_id(), "host": os.uname().nodename, "boot_id": boot_id()}
        return node | {"python": sys.executable, "runtime_env": context.get_runtime_env_string()}

    def placing(self) -> Placer:
        """This actor's Placer, started with its first agent: where that agent's children are placed from."""
        import ray  # type: ignore[import-not-found, unused-ignore]

        if self.placer is None:
            prefix = self.prefix

            def host_actor(node: str) -> Any:
                return ray.get_actor(f"{prefix}-{node}", namespace=NAMESPACE)  # made by the service; ValueError if not yet

            self.placer = Placer(ray, prefix, host_actor, self.mint)
        return self.placer

    def run(self, claim: tuple[str, str, bytes] | None, argv: list[str], environ: dict[str, str], agent_dir: str) -> dict[str, Any]:
        """Check the claim, start the runner, wait for it: {exit_code} or {refused: why}."""
        import ray  # type: ignore[import-not-found, unused-ignore]
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        node, agent_id = ray.get_runtime_context().get_node_id(), Path(agent_dir).name
        try:
            if claim is None:
                raise spawn_claims.ClaimError("no claim: its placement gave none")
            claim_text, signature, tree_key = claim
            key = Ed25519PrivateKey.from_private_bytes(tree_key)
            checked = spawn_claims.verify_claim(claim_text, signature, key.public_key(), audience=node, replay=self.replay)
            if checked.child != agent_id:
                raise spawn_claims.ClaimError(f"the claim is for agent {checked.child}, not {agent_id}")
        except (spawn_claims.ClaimError, ValueError) as exc:
            return {"refused": str(exc)}
        with self.lock:
            if agent_id in self.ran:
                return {"refused": f"this host actor ran agent {agent_id} already (a claim replayed)"}
            self.ran.add(agent_id)
            env = claim_environment(checked, environ) | {ENV_PLACER: str(self.placing().path)}
            with open(Path(agent_dir) / RUNNER_LOG, "ab") as log:
                # Started from this thread, which waits below for as long as the
                # runner lives: the death signal follows the thread, not the process.
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=environ.get("PWD") if environ.get("PWD") and Path(environ["PWD"]).is_dir() else None,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 (prctl only; no locks taken between fork and exec)
                )
            self.agents[agent_id] = Running(checked, key, proc)
        try:
            while True:
                try:
                    return {"exit_code": proc.wait(timeout=1.0)}
                except subprocess.TimeoutExpired:
                    if checked.deadline is not None and time.time() > checked.deadline + DEADLINE_BACKSTOP_S:
                        self.end_group(agent_id, signal.SIGKILL)  # spawn.py's own deadline code did not end it
        finally:
            with self.lock:
                self.agents.pop(agent_id, None)

    def mint(self, peer: int, asked: dict[str, Any]) -> Minter | str:
        """A child's claim, for a process in the tree of an agent this actor runs: the least of that agent's claim and what is asked.

        Who asks is checked first, before anything is placed; the claim is made once its node is known.
        """
        with self.lock:
            running = list(self.agents.items())
        chain = ancestors(peer)
        parent = next(((agent_id, r) for agent_id, r in running if r.proc.pid in chain), None)
        if parent is None:
            return f"process {peer} is not in the process tree of any agent this host actor runs"
        parent_id, run = parent
        if asked.get("parent_id") != parent_id:
            return f"the child asked for is not agent {parent_id}'s"

        def minted(audience: str) -> tuple[str, str, bytes] | str:
            try:
                claim = spawn_claims.narrow_claim(run.claim, child=str(asked.get("id")), audience=audience, asked=asked_limits(asked))
            except spawn_claims.ClaimError as exc:
                return str(exc)
            text, signature = spawn_claims.sign_claim(claim, run.key)
            return text, signature, raw_key(run.key)

        return minted

    def kill(self, agent_id: str, spawn_argv: list[str], environ: dict[str, str], session: str) -> int:
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

    def interrupt(self, agent_id: str) -> bool:
        """SIGINT to the runner, as a terminal's Ctrl-C to a local agent: it ends its subtree and records `interrupted`."""
        with self.lock:
            run = self.agents.get(agent_id)
        if run is None or run.proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(run.proc.pid, signal.SIGINT)
        return True

    def end_group(self, agent_id: str, sig: int) -> None:
        with self.lock:
            run = self.agents.get(agent_id)
        if run is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.proc.pid, sig)


class Token:
    """The pid meta.json names on the launcher's host (TOKEN_SCRIPT): signals to it come back as lines."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", TOKEN_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own group: `spawn.py kill` signals it as it would a runner's
            preexec_fn=default_signals,  # noqa: PLW1509 (libc calls only; no locks taken between fork and exec)
        )
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.fileno()
        os.set_blocking(self.out, False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def said(self) -> str | None:
        """The first signal it was sent (INT, TERM, HUP), GONE when it died, or None."""
        try:
            chunk = os.read(self.out, 256)
        except BlockingIOError:
            return None
        except OSError:
            return "GONE"
        words = chunk.decode(errors="replace").split()
        return words[0] if words else "GONE"

    def end(self) -> None:
        """Its agent has ended: close its pipe (its `cat` sees the end), and make sure of it."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with contextlib.suppress(OSError):
            assert self.proc.stdout is not None
            self.proc.stdout.close()


@dataclass
class Agent:
    """One placed agent, as its Placer follows it."""

    id: str
    log: AgentLog
    host: Any
    """Its node's NodeHost handle."""
    ref: Any
    """The host's `run` call."""
    pg: Any
    token: Token
    where: dict[str, Any]
    spawn_argv: list[str]
    environ: dict[str, str]
    session: str
    ending: bool = False
    stopping: bool = False


class NotPlaced(Exception):
    """The agent was not placed by its deadline: its placement group's state, and where to look."""


class Placer:
    """Places agents for the launchers that ask on its Unix socket, and supervises them in one loop.

    In the placement service, for the launchers on its host (claims signed
    with a new tree key); in a host actor, for its own agents' children
    (claims minted from their parent's). The kernel names each caller
    (SO_PEERCRED): only this user's processes are served.
    """

    def __init__(self, ray: Any, prefix: str, host_actor: Callable[[str], Any], claimer: Claimer) -> None:
        self.ray, self.prefix, self.host_actor, self.claimer = ray, prefix, host_actor, claimer
        self.agents: dict[str, Agent] = {}
        self.lock = threading.Lock()
        self.asking = 0
        """Requests being placed now."""
        self.reserving: dict[str, int] = {}
        """Placement groups asked for near each node and not placed yet: spreads agents before the GCS counts them."""
        self.idle_since = time.monotonic()
        sweep_placer_folders()
        self.folder = tempfile.mkdtemp(prefix=PLACER_FOLDER_PREFIX)  # 0700: only this user reaches the socket
        self.path = Path(self.folder) / PLACER_SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(64)
        self.open = True
        threading.Thread(target=self.accept, name="spawn-place", daemon=True).start()
        threading.Thread(target=self.supervise, name="spawn-supervise", daemon=True).start()

    # ------------------------------------------------------------ requests --

    def accept(self) -> None:
        while self.open:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.asking += 1
            threading.Thread(target=self.answer, args=(conn,), name="spawn-place-request", daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        """One launcher's request: {taken} at once (a launcher that sees nothing may ask again), then where, or why not."""
        asked = False
        try:
            with conn:
                conn.settimeout(REQUEST_READ_S)
                peer, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                if uid != os.getuid():
                    conn.sendall(b'{"error": "not this user\'s process"}\n')
                    return
                request = json.loads(conn.makefile("rb").readline(1 << 24) or b"null")
                if not isinstance(request, dict) or not isinstance(request.get("agent_dir"), str):
                    conn.sendall(b'{"error": "not a placement request"}\n')
                    return
                asked = True
                conn.sendall(b'{"taken": true}\n')
                reply = self.place(peer, request)
                conn.settimeout(5.0)
                try:
                    conn.sendall((json.dumps(reply) + "\n").encode())
                except OSError:  # its launcher gave up: the agent it will never register goes
                    self.abandon(str(reply.get("id") or ""))
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                self.asking -= 1
                if asked:  # not a new placer's sweep probing the socket: that would keep every placer on the host up
                    self.idle_since = time.monotonic()

    def place(self, peer: int, request: dict[str, Any]) -> dict[str, Any]:
        """Reserve the agent's memory, start its runner through its node's host actor, start its token: where, or why not."""
        agent_dir = Path(request["agent_dir"])
        log = AgentLog(agent_dir)
        asked: dict[str, Any] = request["asked"] if isinstance(request.get("asked"), dict) else {}
        place_by = float(request.get("place_by") or time.time() + PLACE_TIMEOUT_S)
        environ = {str(k): str(v) for k, v in (request.get("environ") or {}).items()}
        spawn_argv = [str(word) for word in request.get("spawn") or ()]
        log(f"placing agent {agent_dir.name} from placement service {os.getpid()} ({self.prefix})")
        minter = self.claimer(peer, asked)
        if isinstance(minter, str):  # asked by no one who may: nothing is placed
            log(f"not placed: {minter}")
            return {"error": minter}
        pg, token = None, None
        try:
            pg, node = self.reserve(agent_memory(environ), place_by, log)
            host = self.host_actor(node)
            where = self.ray.get(host.where.remote(), timeout=max(0.1, place_by - time.time()))
            python, env = where.pop("python", None), where.pop("runtime_env", None)
            log(f"placed on node {node} (host {where['host']}); worker: {python}, runtime_env {env}")
            claimed = minter(node)
            if isinstance(claimed, str):  # no claim: the node refuses the agent (exit 4), and says why
                log(f"no claim for agent {agent_dir.name}: {claimed}")
            token = Token()
            environ[ENV_STANDIN] = str(token.pid)
            ref = host.run.remote(
                None if isinstance(claimed, str) else claimed, [*spawn_argv, "_run", str(agent_dir)], environ, str(agent_dir)
            )
        except Exception as exc:  # a placement that never happens: not placed in time, a dead actor, no cluster
            reason = str(exc) if isinstance(exc, NotPlaced) else f"{type(exc).__name__}: {exc}"
            log(f"not placed: {reason}")
            self.release(pg, token)
            return {"error": reason}
        session = str(asked.get("session") or agent_dir.parent.parent)
        agent = Agent(agent_dir.name, log, host, ref, pg, token, where, spawn_argv, environ, session)
        with self.lock:
            self.agents[agent.id] = agent
        log(f"runner started by host actor {self.prefix}-{node}; token {token.pid} stands in for it here")
        return {"backend": "ray", **where, "pid": token.pid, "id": agent.id}

    def reserve(self, memory: int, place_by: float, log: AgentLog) -> tuple[Any, str]:
        """A one-bundle placement group of the agent's memory, near the node with most free: (it, its node)."""
        from ray.util import placement_group, placement_group_table, remove_placement_group  # type: ignore[import-not-found, unused-ignore]

        near = self.freest_node(memory)
        asked_at = time.monotonic()
        pg = placement_group([{"memory": memory}], strategy="STRICT_PACK", _soft_target_node_id=near)
        waiting = f"waiting up to {place_by - time.time():.0f} s"
        log(f"placement group requested: memory {memory / 2**20:.0f} MiB, num_cpus 0, near node {near}; {waiting}")
        try:
            ready, _ = self.ray.wait([pg.ready()], timeout=max(0.1, place_by - time.time()))
        finally:
            if near is not None:
                with self.lock:
                    self.reserving[near] -= 1
        if not ready:
            state = pg_state(pg)
            with contextlib.suppress(Exception):
                remove_placement_group(pg)  # else it waits for memory for ever
            raise NotPlaced(not_placed_reason(state, time.monotonic() - asked_at, memory))
        node = str(placement_group_table(pg)["bundles_to_node_id"][0])
        log(f"placement group placed on node {node} in {time.monotonic() - asked_at:.2f} s")
        return pg, node

    def freest_node(self, memory: int) -> str | None:
        """The alive node with the most Ray memory free, less what this placer is placing there now."""
        try:
            from ray._private.state import available_resources_per_node  # type: ignore[import-not-found, unused-ignore]

            free = available_resources_per_node()
        except Exception:
            return None
        with self.lock:
            fits = [
                (float(res.get("memory", 0)) - self.reserving.get(node, 0) * memory, random.random(), str(node))
                for node, res in free.items()
                if float(res.get("memory", 0)) >= memory
            ]
            if not fits:
                return None
            near = max(fits)[2]
            self.reserving[near] = self.reserving.get(near, 0) + 1
        return near

    def release(self, pg: Any, token: Token | None) -> None:
        if pg is not None:
            from ray.util import remove_placement_group  # type: ignore[import-not-found, unused-ignore]

            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        if token is not None:
            token.end()

    def abandon(self, agent_id: str) -> None:
        """A placed agent whose launcher left before it heard where: its runner is ended (it will never be registered)."""
        with self.lock:
            agent = self.agents.get(agent_id)
        if agent is not None:
            agent.log("its launcher left before it was told where the agent runs: the runner is ended")
            with contextlib.suppress(Exception):
                self.ray.get(agent.host.end_group.remote(agent.id, signal.SIGKILL), timeout=KILL_GRACE_S)

    # --------------------------------------------------------- supervision --

    def supervise(self) -> None:
        """One loop for every agent placed from here: runs that ended, and signals to tokens."""
        while self.open:
            with self.lock:
                agents = [a for a in self.agents.values() if not a.ending]
            ready: set[Any] = set()
            if agents:
                refs = [a.ref for a in agents]
                done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=SUPERVISE_TICK_S)
                ready = set(done)
            else:
                time.sleep(SUPERVISE_TICK_S)
            signalled = set(select.select([a.token.out for a in agents if not a.stopping], [], [], 0)[0]) if agents else set()
            for agent in agents:
                if agent.ref in ready:
                    agent.ending = True
                    threading.Thread(target=self.finish, args=(agent,), daemon=True).start()
                elif agent.token.out in signalled and (said := agent.token.said()) is not None:
                    agent.stopping = True
                    threading.Thread(target=self.stop, args=(agent, said), daemon=True).start()
            self.tick()

    def tick(self) -> None:
        """Once a loop: nothing here (the service adds its own)."""

    def finish(self, agent: Agent) -> None:
        """Its run ended: the node's word when it ended without its runner's outcome, then its placement and token go."""
        ray, where = self.ray, agent.where
        why: str | None = None
        try:
            result = ray.get(agent.ref)
        except ray.exceptions.RayActorError as exc:
            code, why = EXIT_LOST, actor_died_reason(ray, where, exc)
        except Exception as exc:
            code, why = EXIT_LOST, f"its host actor's run failed: {type(exc).__name__}: {exc}"[:1000]
        else:
            if "refused" in result:
                code, why = EXIT_REFUSED, f"the Ray node {where['node_id']} refused it: {result['refused']}"
            else:
                code = int(result["exit_code"])
        if why is not None:
            agent.log(why)
            last_word(agent.log.path.parent, code, why)
        else:
            agent.log(f"its runner ended with exit code {code}")
        self.release(agent.pg, agent.token)
        with self.lock:
            self.agents.pop(agent.id, None)
            self.idle_since = time.monotonic()

    def stop(self, agent: Agent, said: str) -> None:
        """A signal to its token: INT interrupts the agent on its node, anything else kills it there (`spawn.py kill`)."""
        ray, host = self.ray, agent.host
        agent.log(f"its token was sent {said}: {'interrupting' if said == 'INT' else 'killing'} it on its node")
        with contextlib.suppress(Exception):
            if said == "INT":
                ray.get(host.interrupt.remote(agent.id), timeout=KILL_GRACE_S)
            else:
                ray.get(host.kill.remote(agent.id, agent.spawn_argv, agent.environ, agent.session), timeout=KILL_GRACE_S + 10)
        ready, _ = ray.wait([agent.ref], timeout=KILL_GRACE_S)
        if not ready:
            with contextlib.suppress(Exception):
                ray.get(host.end_group.remote(agent.id, signal.SIGKILL), timeout=KILL_GRACE_S)

    def close(self) -> None:
        self.open = False
        with contextlib.suppress(OSError):
            self.sock.close()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def sweep_placer_folders() -> None:
    """Remove this user's placer folders whose socket no process serves any more.

    A host actor's folder stays behind when Ray ends the actor with its job (no
    cleanup runs in a killed worker): each new placer on the host sweeps them, so
    at most the folders of placers that ended since the last one started remain.
    A folder with no socket yet is left for a while: its placer may be binding it.
    """
    import glob
    import shutil

    for folder in glob.glob(os.path.join(tempfile.gettempdir(), PLACER_FOLDER_PREFIX + "*")):
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if not os.path.isdir(folder) or os.path.islink(folder) or info.st_uid != os.getuid():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(os.path.join(folder, PLACER_SOCKET))
                continue  # served
            except ConnectionRefusedError:
                pass  # bound once, served by nobody now
            except FileNotFoundError:
                if time.time() - info.st_mtime < PLACER_FOLDER_GRACE_S:
                    continue
            except OSError:
                continue
        shutil.rmtree(folder, ignore_errors=True)


class Service(Placer):
    """The placement service: the one Ray driver on a launcher's host for a session, and the host actors it owns."""

    def __init__(self, ray: Any, prefix: str, record: Path) -> None:
        self.record = record
        self.hosts: dict[str, Any] = {}
        self.making = threading.Lock()
        self.nodes_at = 0.0
        super().__init__(ray, prefix, self.host_on, self.sign_first)

    def host_on(self, node: str) -> Any:
        """The session's host actor on node: made (pinned there, owned by this service's job) on first use."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # type: ignore[import-not-found, unused-ignore]

        # One handle per node, made once: the first is the owner's, and an actor whose owner's
        # handles are all dropped is ended by Ray (a second handle made alongside would drop it).
        with self.making:
            if node not in self.hosts:
                options = {"name": f"{self.prefix}-{node}", "namespace": NAMESPACE, "get_if_exists": True, "num_cpus": 0}
                options |= {"max_concurrency": HOST_CONCURRENCY, "max_restarts": 0, "max_task_retries": 0}
                options |= {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
                self.hosts[node] = self.ray.remote(NodeHost).options(**options).remote(self.prefix)
            return self.hosts[node]

    @staticmethod
    def sign_first(_peer: int, asked: dict[str, Any]) -> Minter:
        """A tree's first placed agent's claim, signed with a new tree key (kept by the host actor, never written).

        The launchers here are this user's (the socket's folder is 0700, and the kernel names their uid).
        """

        def signed(audience: str) -> tuple[str, str, bytes] | str:
            try:
                key = spawn_claims.new_tree_key()
                text, signature = spawn_claims.sign_claim(claim_for(asked, audience), key)
            except (KeyError, ValueError, TypeError) as exc:
                return f"its meta.json can't make a claim: {type(exc).__name__}: {exc}"
            return text, signature, raw_key(key)

        return signed

    def tick(self) -> None:
        """Host actors for nodes that joined (so that placed agents' children find them), and leave when idle."""
        now = time.monotonic()
        if now - self.nodes_at > NODES_EVERY_S:
            self.nodes_at = now
            with contextlib.suppress(Exception):
                for node in self.ray.nodes():
                    if node.get("Alive") and float((node.get("Resources") or {}).get("memory", 0)) > 0:
                        self.host_on(str(node["NodeID"]))
        with self.lock:
            idle = not self.agents and not self.asking and now - self.idle_since > IDLE_EXIT_S
        if idle and self.leave():
            os._exit(0)  # Ray's job ends with us: its host actors go too

    def leave(self) -> bool:
        """Stop taking requests and remove the record, under the start lock (a launcher starting one waits; one that
        read the record before finds no socket, and starts another)."""
        import fcntl

        fd = os.open(self.record.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a launcher is looking for us now: stay
            with self.lock:
                if self.agents or self.asking:
                    return False
                self.close()
            with contextlib.suppress(OSError):
                if json.loads(self.record.read_text()).get("pid") == os.getpid():
                    self.record.unlink()
            return True
        finally:
            os.close(fd)


def connect(address: str) -> Any:
    environ = ray_environment(dict(os.environ))
    os.environ.clear()
    os.environ.update(environ)
    import ray  # type: ignore[import-not-found, unused-ignore]

    ray.init(address=address, log_to_driver=False, configure_logging=False, namespace=NAMESPACE, runtime_env=runtime_env())
    return ray


def serve(address: str, record: Path) -> int:
    """The placement service for record's session and this host: connect once, serve launchers, leave when idle."""
    say = functools.partial(print, file=sys.stderr, flush=True)
    say(f"ray_place: placement service {os.getpid()} connecting to {address}")
    try:
        ray = connect(address)
    except Exception as exc:
        say(f"ray_place: error: can't connect to the Ray cluster at {address}: {type(exc).__name__}: {exc}")
        return EXIT_LOST
    python = f"Python {sys.version.split()[0]} ({sys.executable})"
    context = ray.get_runtime_context()
    say(f"ray_place: connected to {address} as a driver on node {context.get_node_id()}: Ray {ray.__version__}, {python}")
    say(f"ray_place: runtime_env: {json.dumps(dict(context.runtime_env), sort_keys=True)}")
    session = record.parent.parent.name
    # The service's pid in its actors' names: a second service (one started beside a deaf
    # first) makes its own, never takes the first's, which end with the first one's job.
    service = Service(ray, f"spawn-host-{session}-{record.stem}-{os.getpid()}", record)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    tmp = record.with_name(f".{record.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "socket": str(service.path), "address": address, "boot_id": boot_id()}) + "\n")
    os.replace(tmp, record)
    say(f"ray_place: serving {service.path} for session {session}")
    stopped.wait()
    # SIGTERM: every agent placed from here is killed on its node, then we go.
    with service.lock:
        agents = list(service.agents.values())
    stops = [threading.Thread(target=service.stop, args=(a, "TERM")) for a in agents if not a.stopping]
    for t in stops:
        t.start()
    for t in stops:
        t.join(KILL_GRACE_S * 2)
    service.leave()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ray_place.py", description="Place spawn.py agents on a Ray cluster (started by spawn.py).")
    sub = p.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("serve", help="the placement service for a session on this host")
    run.add_argument("--address", required=True, help="the Ray cluster (ray:ADDRESS's address)")
    run.add_argument("--record", required=True, help="SESSION/placement/KEY.json: where the service says where its socket is")
    args = p.parse_args(argv)
    record = Path(args.record)
    if not record.parent.is_dir():
        print(f"ray_place: error: {record.parent} is not a session's placement folder", file=sys.stderr)
        return 2
    return serve(args.address, record)


if __name__ == "__main__":
    sys.exit(main())
