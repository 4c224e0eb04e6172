"""The Ray seam: ray_address, launch_on_ray (through tools/ray_place.py), a placed runner's stand-in."""

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

import psutil

from ..core.constants import (
    ENV_RAY_PLACE_TIMEOUT,
    ENV_RAY_PYTHON,
    ENV_RAY_SIBLING,
    ENV_RAY_STANDIN,
    ENV_SPAWN_PLACEMENT,
    RAY_PLACE_MARGIN,
    RAY_PLACE_TIMEOUT_S,
    RAY_SIBLING,
    RAY_STANDIN_EXIT,
    RUNNER_LOG,
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
    agent_dir: Path, address: str, runner: list[str], log_fd: int, asked: Mapping[str, Any], *, environ: Mapping[str, str]
) -> tuple[int, int, dict[str, Any]]:
    """Start the stand-in for agent_dir: its pid, its process group, and where Ray placed the agent (node_id, host, boot_id).

    asked (the agent's meta.json to be) goes to the stand-in on stdin: under a
    placed parent, the stand-in asks the parent's host actor for its claim with
    it while this launcher, a descendant of the parent's runner, still waits.
    The stand-in reports one JSON line on a pipe, then points its own stdout
    at the runner log: nothing Ray prints reaches ours. It is told to give up
    (--place-by) before this launcher does, so that it says why; a stand-in
    that says nothing in time is ended with its whole process group, and the
    error quotes the runner log's tail.
    """
    timeout = place_timeout(environ)
    started = time.time()
    place_by = started + timeout * (1 - RAY_PLACE_MARGIN)
    argv = [*ray_sibling_command(environ), "run", "--address", address, "--place-by", f"{place_by:.3f}", "--spawn", *runner]
    proc = subprocess.Popen(
        [*argv, "--", str(agent_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    feed_stdin(proc.stdin, json.dumps(dict(asked)).encode())
    line = placement_line(proc, started + timeout)
    try:
        where = json.loads(line) if line.strip() else None
        if not isinstance(where, dict) or "node_id" not in where:
            raise ValueError(where.get("error") if isinstance(where, dict) else None)
    except ValueError as exc:
        # A stand-in that said why (its error line) or nothing at all: its whole group goes (uv and the Ray driver below it).
        Supervised.signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        said = str(exc) if exc.args and exc.args[0] else None
        if said is None:
            ended = f"exited {proc.returncode}" if proc.returncode not in (None, -signal.SIGKILL) else f"said nothing in {timeout:.0f} s"
            said = f"its stand-in (process {proc.pid}) {ended}"
        raise StateError(f"placement ray:{address}: the agent was not placed: {said}; {log_tail(agent_dir, said)}") from None
    return (
        standin_pid(proc.pid, where.get("pid")),
        proc.pid,
        {
            "backend": "ray",
            "node_id": str(where["node_id"]),
            "host": where.get("host"),
            "boot_id": where.get("boot_id"),
        },
    )


def placement_line(proc: subprocess.Popen[bytes], limit: float) -> bytes:
    """The stand-in's one line, read until limit (wall clock) or until it exits; its stdout is closed then."""
    assert proc.stdout is not None
    line = b""
    while not line.endswith(b"\n") and time.time() < limit:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        elif proc.poll() is not None:
            break
    proc.stdout.close()
    return line


def standin_pid(started: int, reported: Any) -> int:
    """The stand-in's own pid, which it reports: the process we started, or one below it in its group (uv runs it as a child).

    Anything else is not trusted: the process we started is recorded.
    """
    if not isinstance(reported, int) or reported == started:
        return started
    try:
        proc = psutil.Process(reported)
        if os.getpgid(reported) == started and started in (p.pid for p in proc.parents()):
            return reported
    except (psutil.Error, OSError):
        pass
    return started


def log_tail(agent_dir: Path, said: str = "", lines: int = 3, width: int = 240) -> str:
    """The last lines of the agent's runner.log, on one line, for an error message (a line repeating `said` left out)."""
    try:
        with open(agent_dir / RUNNER_LOG, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode(errors="replace")
    except OSError:
        return f"{agent_dir / RUNNER_LOG} can't be read"
    kept = [line.strip()[:width] for line in text.splitlines() if line.strip() and not (said and said in line)][-lines:]
    if not kept:
        return f"{agent_dir / RUNNER_LOG} says nothing more"
    return f"{agent_dir / RUNNER_LOG} ends: {' | '.join(kept)}"


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


def node_lost_reason(meta: AgentMeta, agent_dir: Path) -> str | None:
    """Why a placed agent's stand-in ended without an outcome.

    The stand-in's last word when it left one (its node lost, its claim
    refused, its deadline's backstop); else it died where it ran, on the
    launcher's host, and the agent's node is not blamed.
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
    # No word: SIGKILLed there, or the Ray node its driver hung on there died with it (Ray ends such a driver at once).
    unknown = "without a word (killed there, or its own Ray node there lost)"
    return f"its stand-in ended on the launcher's host {meta.host} {unknown}; the agent ran on the Ray node {node}"
