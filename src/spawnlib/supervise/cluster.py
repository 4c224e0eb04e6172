"""The Ray seam: ray_address, launch_on_ray (through tools/ray_place.py's placement service), a placed runner's token."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from ..core.constants import (
    ENV_RAY_PLACE_TIMEOUT,
    ENV_RAY_PLACER,
    ENV_RAY_PYTHON,
    ENV_RAY_SIBLING,
    ENV_RAY_STANDIN,
    ENV_SPAWN_PLACEMENT,
    PLACEMENT_DIR,
    RAY_PLACE_MARGIN,
    RAY_PLACE_TIMEOUT_S,
    RAY_SIBLING,
    RAY_STANDIN_EXIT,
    RUNNER_LOG,
    SCRIPT_DIR,
)
from ..core.errors import StateError, UsageError
from ..core.records import AgentMeta
from ..session.protocol import flocked
from .supervisor import Supervised

# ------------------------------------------------------------------ cluster --
#
# The Ray backend's seam in spawn.py: Ray itself lives in the sibling
# tools/ray_place.py (its own lock), which spawn.py runs, never imports. For
# an agent placed on Ray, the launcher asks the session's placement service
# on this host (the one Ray driver here, started by the first launcher that
# needs it) instead of starting its own runner. The service starts the runner
# on a node, and a token here: a tiny shell that is the agent's process on
# this host, which the runner on the node names (SPAWN_RAY_STANDIN).


def ray_address(meta: AgentMeta, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster an agent is placed on, or None (local).

    From meta.json's placement when the resolver set one (backend ray, policy
    ray:ADDRESS), else from SPAWN_PLACEMENT.
    """
    placement = meta.placement or {}
    if placement.get("backend") not in (None, "ray"):
        return None
    policy = str(placement.get("policy") or environ.get(ENV_SPAWN_PLACEMENT, ""))
    name, _, address = policy.strip().partition(":")
    return address.strip() or None if name == "ray" else None


def ray_sibling_command(environ: Mapping[str, str]) -> list[str]:
    """How to run tools/ray_place.py: SPAWN_RAY_SIBLING (path), else tools/ beside spawn.py;
    with SPAWN_RAY_PYTHON (its venv's python), else `uv run --script` (its own lock)."""
    sibling = Path(environ.get(ENV_RAY_SIBLING) or SCRIPT_DIR / "tools" / RAY_SIBLING)
    if not sibling.is_file():
        raise UsageError(
            f"placement ray: {sibling} is not there; copy tools/{RAY_SIBLING} (and tools/spawn_claims.py) beside spawn.py, "
            f"or set {ENV_RAY_SIBLING}"
        )
    python = environ.get(ENV_RAY_PYTHON)
    return [python, str(sibling)] if python else ["uv", "run", "--quiet", "--script", str(sibling)]


def place_timeout(environ: Mapping[str, str]) -> float:
    """How long a launcher waits for a placement: SPAWN_RAY_PLACE_TIMEOUT seconds, else RAY_PLACE_TIMEOUT_S."""
    text = environ.get(ENV_RAY_PLACE_TIMEOUT, "").strip()
    if not text:
        return RAY_PLACE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise UsageError(f"{ENV_RAY_PLACE_TIMEOUT}={text!r}: give seconds, e.g. {ENV_RAY_PLACE_TIMEOUT}=120")
    return value


def launch_on_ray(
    agent_dir: Path, address: str, runner: list[str], asked: Mapping[str, Any], *, environ: Mapping[str, str]
) -> tuple[int, int, dict[str, Any]]:
    """Have agent_dir placed on the cluster: its token's pid and group here, and where Ray placed it (node_id, host, boot_id).

    Asked of the session's placement service on this host (started when there
    is none), or, below a placed agent, of its node's host actor
    ($SPAWN_RAY_PLACER). asked (the agent's meta.json to be) carries the
    limits its claim is made from. The placing side is told to give up
    (place_by) before this launcher does, so that it says why; the error
    quotes the runner log's tail.
    """
    timeout = place_timeout(environ)
    started = time.time()
    request = {
        "agent_dir": str(agent_dir),
        "asked": dict(asked),
        "place_by": started + timeout * (1 - RAY_PLACE_MARGIN),
        "spawn": runner,
        "environ": dict(environ),  # the runner's on its node, as a local runner's is the launcher's
    }
    limit = started + timeout
    placer = environ.get(ENV_RAY_PLACER)
    unanswered: str | None = None
    why = "was not asked"
    for _ in range(3):  # a service that left (or died) between our finding it and asking it is started again
        socket_path = placer or placement_service(Path(str(asked["session"])), address, environ, limit, unanswered)
        try:
            where = ask_placer(socket_path, request, limit)
            break
        except NotTaken as exc:
            if placer:
                raise StateError(f"placement ray:{address}: the agent was not placed: its parent's host actor {exc}") from None
            unanswered, why = socket_path, str(exc)
    else:
        raise StateError(f"placement ray:{address}: the agent was not placed: the session's placement service {why}")
    if "error" in where or "node_id" not in where or not isinstance(where.get("pid"), int):
        said = str(where.get("error") or f"its placing side answered {json.dumps(where)[:300]}")
        raise StateError(f"placement ray:{address}: the agent was not placed: {said}; {log_tail(agent_dir, said)}")
    token = int(where["pid"])  # the token: a process of the service's (or the host actor's) on this host, in a group of its own
    return token, token, {"backend": "ray", "node_id": str(where["node_id"]), "host": where.get("host"), "boot_id": where.get("boot_id")}


class NotTaken(Exception):
    """The placing side did not take the request (it left, or was never there): nothing was placed."""


def ask_placer(socket_path: str, request: Mapping[str, Any], limit: float) -> dict[str, Any]:
    """One request on the placer's socket: it says {taken} at once, then where (or why not) once placed."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.settimeout(max(0.1, min(10.0, limit - time.time())))
            sock.connect(socket_path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            lines = sock.makefile("rb")
            taken = lines.readline(1 << 16)
        except OSError as exc:
            raise NotTaken(f"could not be asked: {exc.strerror or exc}") from None
        if not taken.strip():
            raise NotTaken("closed the request unanswered")
        try:
            first = json.loads(taken)
        except ValueError:
            raise NotTaken("answered something other than JSON") from None
        if not isinstance(first, dict):
            raise NotTaken("answered no object")
        if "taken" not in first:
            return first
        waiting = time.time()
        sock.settimeout(max(0.1, limit - waiting))
        try:
            line = lines.readline(1 << 20)
        except OSError:  # the time was up, or the placing side went
            line = b""
    if not line.strip():
        return {"error": f"the placing side said nothing in {time.time() - waiting:.0f} s"}
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    return dict(answer) if isinstance(answer, dict) else {"error": "the placing side answered no object"}


def placement_service(session: Path, address: str, environ: Mapping[str, str], limit: float, unanswered: str | None = None) -> str:
    """The socket of the session's placement service on this host for address: found, or started (one Ray driver per host).

    unanswered: a socket that just took no request; a record still naming it is forgotten, and another service started.
    """
    import hashlib
    import socket

    folder = session / PLACEMENT_DIR
    folder.mkdir(exist_ok=True)
    key = f"{socket.gethostname()}-{hashlib.sha256(address.encode()).hexdigest()[:8]}"
    record = folder / f"{key}.json"
    with flocked(folder / f"{key}.lock"):  # held while we look and start: concurrent launchers start one service
        if (found := live_service(record)) is not None and found != unanswered:
            return found
        with contextlib.suppress(FileNotFoundError):
            record.unlink()  # a dead (or deaf) service's
        with open(folder / f"{key}.log", "ab") as log:
            argv = [*ray_sibling_command(environ), "serve", "--address", address, "--record", str(record)]
            # None of an agent's identity: the service serves the session's launchers, and belongs to no agent.
            env = {name: value for name, value in environ.items() if not name.startswith("SPAWN_")}
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        while time.time() < limit and proc.poll() is None:
            if (found := live_service(record)) is not None:
                return found
            time.sleep(0.05)
        Supervised.signal_group(proc.pid, signal.SIGKILL)  # uv and the service below it
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        ended = f"exited {proc.returncode}" if proc.returncode not in (None, -signal.SIGKILL) else "was not serving in time"
        raise StateError(f"placement ray:{address}: the session's placement service {ended}; {log_tail(folder / f'{key}.log')}")


def live_service(record: Path) -> str | None:
    """The socket a service's record names, while that service runs."""
    try:
        data = json.loads(record.read_text())
        pid, path = int(data["pid"]), str(data["socket"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # dead, not yet reaped by the launcher that started it
            return None
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        pass
    return path if os.path.exists(path) else None


def log_tail(where: Path, said: str = "", lines: int = 3, width: int = 240) -> str:
    """The last lines of a log (an agent's runner.log), on one line, for an error message (a line repeating `said` left out)."""
    path = where / RUNNER_LOG if where.is_dir() else where
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode(errors="replace")
    except OSError:
        return f"{path} can't be read"
    kept = [line.strip()[:width] for line in text.splitlines() if line.strip() and not (said and said in line)][-lines:]
    if not kept:
        return f"{path} says nothing more"
    return f"{path} ends: {' | '.join(kept)}"


def ray_standin(meta: AgentMeta, environ: Mapping[str, str]) -> int | None:
    """The token pid a placed runner may run under: meta.json names it, not the runner."""
    if (meta.placement or {}).get("backend") != "ray":
        return None
    try:
        return int(environ.get(ENV_RAY_STANDIN, ""))
    except ValueError:
        return None


def node_lost_reason(meta: AgentMeta, agent_dir: Path) -> str | None:
    """Why a placed agent's token ended without an outcome.

    The placing side's last word when it left one (its node lost, its claim
    refused); else the token or its service died on the launcher's host, and
    the agent's node is not blamed.
    """
    placement = meta.placement or {}
    if placement.get("backend") != "ray":
        return None
    node = f"{placement.get('node_id')} (host {placement.get('host')})"
    try:
        word = json.loads((agent_dir / RAY_STANDIN_EXIT).read_text())
    except (OSError, ValueError):
        word = None
    if isinstance(word, dict) and isinstance(word.get("reason"), str) and word["reason"]:
        return str(word["reason"])[:1000]
    # No word: the token SIGKILLed there, or the placement service there ended (Ray ends its agents with it).
    unknown = "without a word (killed there, or its placement service there ended)"
    return f"its token ended on the launcher's host {meta.host} {unknown}; the agent ran on the Ray node {node}"
