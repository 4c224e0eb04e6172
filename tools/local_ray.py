"""A local Ray test cluster on one machine: a head and workers, stopped by pid (dev tool; tests and bench_ray import it).

Each node is `ray start --block` in a process group of its own, started one
after the other (two joining at once race for the head's ports). Stopped by
SIGTERM to each `ray start`, then SIGKILL of its group. Never `ray stop`: it
ends every Ray cluster on the machine, found by process name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# A loaded machine starts a node's Python agents slowly: past this a node counts as not started.
NODE_START_S = 300
# The ports a node's own agents listen on: left dynamic, the raylet waits for the
# metrics agent's port file, which a loaded 2-core machine may write after its check gave up.
NODE_IP = re.compile(r"Local node IP\S*: \S*?(\d+\.\d+\.\d+\.\d+)")
AGENT_PORTS = ("metrics-export-port", "dashboard-agent-grpc-port", "dashboard-agent-listen-port", "runtime-env-agent-port")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalCluster:
    ray_cli: str
    logs: Path
    address: str = ""
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    temp_dir: str = ""
    plain: bool = False

    def alive_nodes(self) -> int:
        try:
            out = subprocess.run(
                [self.ray_cli, "status", "--address", self.address], capture_output=True, text=True, timeout=60, check=False
            )
        except subprocess.TimeoutExpired:
            return 0
        active = out.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
        return len(re.findall(r"^\s*1 node_", active, re.MULTILINE))

    def start(self, workers: int = 2, *, memory: int = 2_000_000_000, own_pid_namespace: bool = False, plain: bool = False) -> None:
        """The head, then each worker once the cluster counts the one before; RuntimeError naming the log if one doesn't join.

        own_pid_namespace: the last worker runs in a pid namespace of its own
        (`unshare --pid`, which needs root), as a node of another host or
        container would: its pids mean nothing here.
        plain: as a user starts a cluster, `ray start --head` and `ray start
        --address` with Ray's defaults; only the head's port and temp dir are
        chosen, so that it is this cluster's own on a shared machine.
        """
        # Ray refuses a temp dir inside a virtualenv (nox puts TMPDIR there), and its
        # socket paths must stay under the 108-byte limit: a short folder in /tmp.
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self.plain = plain
        port = free_port()
        common = [] if plain else ["--num-cpus=1", f"--memory={memory}", "--object-store-memory=80000000", "--disable-usage-stats"]
        head = ["--head", f"--port={port}", f"--temp-dir={self.temp_dir}"]
        self._node([*head, *([] if plain else ["--include-dashboard=false"]), *common], self.logs / "head.log")
        # The head binds the host's address, which workers and drivers must use.
        ip = self._wait(lambda: NODE_IP.search((self.logs / "head.log").read_text()), "head.log")
        self.address = f"{ip.group(1)}:{port}"
        self._wait(lambda: self.alive_nodes() >= 1 or None, "head.log")
        for n in range(1, workers + 1):
            isolated = own_pid_namespace and n == workers
            wrapper = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"] if isolated else []
            self._node([f"--address={self.address}", *common], self.logs / f"w{n}.log", wrapper)
            self._wait(lambda: self.alive_nodes() >= len(self.nodes) or None, f"w{n}.log")

    def _node(self, argv: list[str], log: Path, wrapper: Sequence[str] = ()) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"RAY_USAGE_STATS_ENABLED": "0"}  # what `ray start` would ask a terminal, answered no
        if not self.plain:
            env |= {"RAY_agent_register_timeout_ms": "600000", "RAY_raylet_start_wait_time_s": "300"}
        ports = [] if self.plain else [f"--{name}={free_port()}" for name in AGENT_PORTS]
        with open(log, "ab") as out:
            argv = [*wrapper, self.ray_cli, "start", "--block", *argv, *ports]
            self.nodes.append(subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True, env=env))

    def _wait(self, ready: Callable[[], T | None], log: str) -> T:
        limit = time.monotonic() + NODE_START_S
        while time.monotonic() < limit:
            got = ready()
            if got:
                return got
            if any(node.poll() is not None for node in self.nodes):
                break
            time.sleep(0.5)
        raise RuntimeError(f"a Ray node did not start: see {self.logs / log}:\n{(self.logs / log).read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to each `ray start`, last first, a moment to stop its children, then SIGKILL of its whole group."""
        for node in reversed(self.nodes):
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        self.nodes.clear()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
