"""The shell the bench runs its commands in: a user's, pointed at the scripted model, with the uv
binary itself and an optional private bytecode cache.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench_cost import environment as bench_cost_environment

from .core import fmt, median


def bench_environment(base: Mapping[str, str], workdir: Path, url: str, pycache: str) -> dict[str, str]:
    """A user's shell pointed at the mock (bench_cost.environment), with uv's own cache and Python unbuffered."""
    env = bench_cost_environment(base, workdir, url)
    env["PYTHONUNBUFFERED"] = "1"
    # uv keeps its cache (the script's environment) under HOME: the real one,
    # or every `uv run spawn.py` would build the environment again.
    env["UV_CACHE_DIR"] = base.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    env["UV_PYTHON_INSTALL_DIR"] = base.get("UV_PYTHON_INSTALL_DIR") or str(Path.home() / ".local" / "share" / "uv" / "python")
    if pycache == "private":
        env.update(private_pycache(workdir))
    return env


@dataclass
class UvFound:
    """The uv the chains run: the binary, and the wrapper script PATH put in front of it, if any."""

    binary: str | None
    wrapper: str | None = None
    wrapper_s: float | None = None  # median `uv --version` through the wrapper
    binary_s: float | None = None  # the same, the binary itself

    def describe(self) -> str:
        if self.binary is None:
            return "uv: not on PATH (the uv chain fails)"
        if self.wrapper is None:
            return f"uv: {self.binary}"
        return (
            f"uv: {self.binary}, the binary behind {self.wrapper} on PATH (a wrapper script, "
            f"{fmt(1000 * (self.wrapper_s or math.nan), 'ms')} a call against {fmt(1000 * (self.binary_s or math.nan), 'ms')}); "
            "the chains run the binary, as a standalone install would"
        )


def find_uv(env: Mapping[str, str], workdir: Path) -> tuple[UvFound, dict[str, str]]:
    """The uv on PATH, and an environment whose `uv` is the binary itself.

    A version manager's shim (pyenv's, asdf's) is a shell script that runs a
    program of its own before uv: about 60 ms a call here, paid at every level
    of the uv chain and never by the bare chain. It is the machine's, not uv's
    or spawn.py's, so the chains run the binary it leads to (uv names itself
    to the commands it runs, in UV) and the wrapper's cost is printed beside.
    """
    found = shutil.which("uv", path=env.get("PATH"))
    if found is None:
        return UvFound(None), dict(env)
    with open(found, "rb") as fh:
        if fh.read(2) != b"#!":
            return UvFound(found), dict(env)
    proc = subprocess.run(
        [found, "run", "--no-project", "--quiet", "--", "printenv", "UV"],
        env=dict(env),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    binary = proc.stdout.strip()
    if proc.returncode != 0 or not binary or not os.access(binary, os.X_OK):
        return UvFound(found), dict(env)  # can't tell: measure what PATH gives
    bin_dir = workdir / "uv-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "uv").symlink_to(binary)

    def version_s(uv: str) -> float:
        secs = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([uv, "--version"], env=dict(env), capture_output=True, check=False, timeout=60)
            secs.append(time.perf_counter() - t)
        return median(secs)

    uv = UvFound(binary, found, version_s(found), version_s(binary))
    return uv, {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


def private_pycache(workdir: Path) -> dict[str, str]:
    """Bytecode cached in the temp dir: what a normal install sees after its first run.

    Without a cache (e.g. PYTHONDONTWRITEBYTECODE=1 inherited) every Python
    start compiles the SDK and its dependencies from source again. The prefix
    keeps the benchmark from writing into the caller's site-packages.
    """
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(workdir / "pycache")}
