#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["nox>=2025.2.9"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""Project tasks: `uvx nox` runs lint, typecheck and tests; `uvx nox -s bench` the benchmark.

spawn.py is generated from the package src/spawnlib by tools/bundle.py:
`uvx nox -s bundle` writes it, `uvx nox -s bundle -- --check` fails when it
is stale. Its dependencies are read from its own PEP 723 block and pinned by
spawn.py.lock, so they are listed once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
# tools/benchlib: the bench's modules (tools/bench.py is their entry).
TOOLS = [*(ROOT / "tools").glob("*.py"), *(ROOT / "tools" / "benchlib").glob("*.py")]
SCRIPTS = ["spawn.py", "noxfile.py", *sorted(str(p.relative_to(ROOT)) for p in TOOLS)]
PACKAGE = "src/spawnlib"  # spawn.py's source; never on a runtime path
# hatchling: pyproject.toml's build backend. tests/test_api.py installs the
# project into a fresh venv offline, from uv's cache, where installing it here puts it.
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "hatchling>=1.26"]
# The end-to-end tests mostly wait on the CLI and the scripted model (a test
# file keeps one core under half busy), so four workers share two cores well.
TEST_WORKERS = "4"
# Pinned so a new release can't turn a green main red overnight.
RUFF = "ruff==0.17.5"
MYPY = "mypy==2.4.1"
COSMIC_RAY = "cosmic-ray==8.7.0"  # the mutants' generator (tools/mutants.py)


def install_spawn_deps(session: nox.Session) -> None:
    """spawn.py's dependencies at the versions spawn.py.lock pins."""
    requirements = Path(session.create_tmp()) / "spawn-requirements.txt"
    session.run_install(
        "uv", "export", "--script", "spawn.py", "--frozen", "--no-hashes", "--quiet", "-o", str(requirements),
        external=True,
    )  # fmt: skip
    # Bytecode up front: PYTHONDONTWRITEBYTECODE may be set, and every nested
    # agent imports the SDK again.
    session.install("-r", str(requirements), env={"UV_COMPILE_BYTECODE": "1"})


# Siblings too heavy for every venv (Ray is ~100 MB): only their own nox session installs them.
HEAVY_SIBLINGS = {"ray_place.py": "ray"}


def install_tool_deps(session: nox.Session, only: str | None = None) -> None:
    """The runtime siblings' dependencies (tools/X.py with a lock), as their locks pin them.

    The tests need them too: tests/test_otel.py decodes spans with opentelemetry-proto,
    which the OTLP exporter depends on, the MCP server's tests use the mcp package, and
    the A2A server's tests drive it with a2a-sdk's own client. A heavy sibling
    (HEAVY_SIBLINGS) is installed only when `only` names it.
    """
    for script in sorted((ROOT / "tools").glob("*.py")):
        if not script.with_name(script.name + ".lock").exists():
            continue
        if (script.name in HEAVY_SIBLINGS) != (only == script.name):
            continue
        requirements = Path(session.create_tmp()) / f"{script.stem}-requirements.txt"
        session.run_install(
            "uv", "export", "--script", str(script), "--frozen", "--no-hashes", "--quiet", "-o", str(requirements),
            external=True,
        )  # fmt: skip
        if any(line.strip() and not line.startswith("#") for line in requirements.read_text().splitlines()):
            # Bytecode up front for a heavy sibling: a Ray node's agents import it at
            # start, and the raylet gives up on an agent that takes over 15 s.
            session.install("-r", str(requirements), env={"UV_COMPILE_BYTECODE": "1"} if only else None)


def run_pytest(session: nox.Session, marks: str, timeout: int) -> None:
    install_spawn_deps(session)
    install_tool_deps(session)
    session.install(*TEST_DEPS)
    # A hung test fails after `timeout` seconds instead of eating the CI budget.
    session.run("pytest", *(session.posargs or ["-q", "-n", TEST_WORKERS, f"--timeout={timeout}", "--durations=40", "-m", marks, "tests"]))


@nox.session
def tests(session: nox.Session) -> None:
    """Unit and end-to-end tests (the real bundled claude CLI against tools/mock_model.py)."""
    run_pytest(session, "not slow and not ray", 300)


def install_ray_deps(session: nox.Session) -> None:
    """spawn.py's, the siblings', and the Ray sibling's own: what a local cluster's nodes and drivers run."""
    install_spawn_deps(session)
    install_tool_deps(session)
    install_tool_deps(session, only="ray_place.py")


@nox.session
def ray(session: nox.Session) -> None:
    """Cluster tests (marked ray): a local 3-node Ray cluster runs placed agents. `uvx nox -s ray`."""
    install_ray_deps(session)
    session.install(*TEST_DEPS)
    cluster_tests = sorted(str(p) for p in (ROOT / "tests").glob("test_ray*.py"))
    session.run("pytest", *(session.posargs or ["-q", "--timeout=900", "-m", "ray", *cluster_tests]))


@nox.session(name="ray_bench")
def ray_bench(session: nox.Session) -> None:
    """40 leaves on a local 3-node Ray cluster against the same 40 placed locally: `uvx nox -s ray_bench`."""
    install_ray_deps(session)
    session.run("python", "tools/bench_ray.py", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """The soak-style tests (marked slow) that `tests` leaves out: `uvx nox -s slow`."""
    run_pytest(session, "slow", 600)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting (spawn.py, generated, is linted but never formatted: ruff.toml)."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on every script and on the tests."""
    install_spawn_deps(session)
    install_tool_deps(session)
    session.install(MYPY, "types-psutil", "types-jsonschema", "types-PyYAML", "types-protobuf", *TEST_DEPS, "nox")
    session.run("mypy", "--strict", *SCRIPTS)
    session.run("mypy", "--strict", PACKAGE)
    # Separately: the tests import spawn, conftest and tools/mock_model as top-level modules.
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("*.py"))
    session.run("mypy", "--strict", *tests, env={"MYPYPATH": f"{ROOT}:{ROOT / 'tools'}:{ROOT / 'src'}"})
    typecheck_installed(session)


def typecheck_installed(session: nox.Session) -> None:
    """The examples users copy (docs/examples), against the project as `uv pip install .` installs it.

    In a venv of their own, checked from outside the checkout: mypy must find
    the installed package spawn and its py.typed, not the spawn.py beside it.
    """
    work = Path(session.create_tmp()).resolve()  # nox gives it relative to the checkout; the chdir below would lose it
    python = work / "installed" / "bin" / "python"
    session.run(
        "uv", "venv", "--quiet", "--allow-existing", "--python", str(Path(session.bin) / "python"), str(python.parent.parent), external=True
    )
    session.run("uv", "pip", "install", "--quiet", "--reinstall-package", "spawn-py", "--python", str(python), str(ROOT), external=True)
    examples = sorted(str(p) for p in (ROOT / "docs" / "examples").glob("*.py"))
    with session.chdir(work):
        session.run("mypy", "--strict", "--python-executable", str(python), *examples)


@nox.session(venv_backend="none")
def bundle(session: nox.Session) -> None:
    """Write spawn.py from src/spawnlib (tools/bundle.py); `-- --check` exits 1 if it is stale."""
    session.run(sys.executable, "tools/bundle.py", *session.posargs, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Side-by-side figures against the scripted model (tools/bench.py)."""
    install_spawn_deps(session)
    install_tool_deps(session)
    session.run("python", "tools/bench.py", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing on the guarantees (tools/mutants.toml): `uvx nox -s mutants -- --hand --jobs 2`."""
    install_spawn_deps(session)
    install_tool_deps(session)
    session.install(*TEST_DEPS, COSMIC_RAY)
    session.run("python", "tools/mutants.py", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Kill trials (tools/soak.py): `uvx nox -s soak -- --trials 1000`."""
    install_spawn_deps(session)
    session.run("python", "tools/soak.py", *(session.posargs or ["--trials", "200", "--jobs", "2"]))


if __name__ == "__main__":
    nox.main()
