from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.constants import (
    ENV_RAY_PYTHON,
    ENV_RAY_SIBLING,
    ENV_RAY_STANDIN,
    ENV_SPAWN_PLACEMENT,
    RAY_PLACE_TIMEOUT_S,
    RAY_SIBLING,
    SCRIPT_DIR,
)
from ..core.errors import StateError, UsageError
from ..core.records import AgentMeta
from .supervisor import Supervised

# ------------------------------------------------------------------ cluster --
#
# The Ray backend's seam in spawn.py: Ray itself lives in the sibling
# tools/ray_place.py (its own lock), which spawn.py runs, never imports. For
# an agent placed on Ray, the launcher starts the sibling instead of its own
# runner; the sibling (the stand-in) is the agent's process here, and the
# runner it has started on a node names it (SPAWN_RAY_STANDIN).


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


def launch_on_ray(agent_dir: Path, address: str, runner: list[str], log_fd: int, asked: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """Start the stand-in for agent_dir; its pid and where Ray placed the agent (node_id, host, boot_id).

    asked (the agent's meta.json to be) goes to the stand-in on stdin: under a
    placed parent, the stand-in asks the parent's host actor for its claim with
    it while this launcher, a descendant of the parent's runner, still waits.
    The stand-in reports one JSON line on a pipe, then points its own stdout
    at the runner log: nothing Ray prints reaches ours.
    """
    argv = [*ray_sibling_command(os.environ), "run", "--address", address, "--spawn", *runner, "--", str(agent_dir)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    feed_stdin(proc.stdin, json.dumps(dict(asked)).encode())
    line = b""
    limit = time.monotonic() + RAY_PLACE_TIMEOUT_S
    while not line.endswith(b"\n") and time.monotonic() < limit and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    proc.stdout.close()
    try:
        where = json.loads(line)
        if not isinstance(where, dict) or "node_id" not in where:
            raise ValueError(where.get("error") if isinstance(where, dict) else "no placement")
    except ValueError as exc:
        if proc.poll() is None:
            Supervised.signal_pid(proc.pid, signal.SIGKILL)  # our own child, not yet reaped
        raise StateError(f"placement ray:{address}: the agent was not placed ({exc}); see {agent_dir}/runner.log") from None
    return proc.pid, {"backend": "ray", "node_id": str(where["node_id"]), "host": where.get("host"), "boot_id": where.get("boot_id")}


def feed_stdin(pipe: Any, data: bytes) -> None:
    """Write data to a child's stdin and close it, from a thread: a big task must not block the placement line."""
    import threading

    def feed() -> None:
        with contextlib.suppress(OSError):  # a stand-in that died at once: its missing line says so
            pipe.write(data)
        with contextlib.suppress(OSError):
            pipe.close()

    threading.Thread(target=feed, name="stand-in stdin", daemon=True).start()


def ray_standin(meta: AgentMeta, environ: Mapping[str, str]) -> int | None:
    """The stand-in pid a placed runner may run under: meta.json names it, not the runner."""
    if (meta.placement or {}).get("backend") != "ray":
        return None
    try:
        return int(environ.get(ENV_RAY_STANDIN, ""))
    except ValueError:
        return None


def node_lost_reason(meta: AgentMeta) -> str | None:
    """Why a placed agent's stand-in ended without an outcome: its node, named."""
    placement = meta.placement or {}
    if placement.get("backend") != "ray":
        return None
    return f"the Ray node {placement.get('node_id')} (host {placement.get('host')}) running it was lost, or its runner died"
