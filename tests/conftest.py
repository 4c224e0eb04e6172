"""Shared fixtures: a private HOME and session root per test, the scripted model.

End-to-end tests run the real `claude` CLI bundled with claude-agent-sdk,
through spawn.py, against tools/mock_model.py. Nothing is stubbed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import py_compile
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import psutil
import pytest

# Run from inside a spawned agent, the tests would inherit its depth, deadline,
# tools and session, and every spawn.py they start (or import) would obey them.
for _name in [n for n in os.environ if n.startswith("SPAWN_") or n == "TRACEPARENT"]:
    del os.environ[_name]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # unit tests import the package: the file you test is the file you edit
sys.path.append(str(ROOT / "tools"))  # and the scripted model's helpers, and the bundler
SPAWN = ROOT / "spawn.py"  # what end-to-end tests run: generated afresh before any test (pytest_configure)
SCHEMAS = ROOT / "schemas"

import bundle as bundler  # noqa: E402  (needs tools/ on the path)
import mock_model as mock_model_module  # noqa: E402


def source_namespace() -> types.ModuleType:
    """`spawn` as the tests import it: the package's own modules, as one namespace.

    spawn.py is one namespace laid out from the modules in tools/bundle.py's
    MODULES order; this is the same names, bound to the objects of
    src/spawnlib's modules as Python imports them. So a test of a function
    tests the source a maintainer edits, with no bundle step in between, and
    a traceback names the module's own file and line. The built-in files
    are filled in as the bundler fills them into spawn.py.
    """
    import spawnlib

    namespace = types.ModuleType("spawn", spawnlib.__doc__)
    namespace.__version__ = spawnlib.__version__  # type: ignore[attr-defined]
    modules = []
    for name in bundler.MODULES:
        module = importlib.import_module(f"spawnlib.{name.replace('/', '.')}")
        modules.append(module)
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        for defined in bundler.defined_names(tree.body):
            if hasattr(module, defined):  # not what only runs as __main__ (the stand-in's walrus)
                setattr(namespace, defined, getattr(module, defined))
    namespace.__dict__["package_modules"] = tuple(modules)
    namespace.BUILTIN_FILES.update(bundler.embedded_files(namespace.RECORD_SCHEMAS))
    return namespace


sys.modules["spawn"] = source_namespace()


def patch_name(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """monkeypatch.setattr(spawn, name, value) with one namespace's meaning: every module
    of the package that binds the same object (its own, or imported) gets value too."""
    spawn = sys.modules["spawn"]
    old = getattr(spawn, name)
    monkeypatch.setattr(spawn, name, value)
    for module in spawn.package_modules:
        if name in vars(module) and vars(module)[name] is old:
            monkeypatch.setattr(module, name, value)


def pytest_sessionstart(session: pytest.Session) -> None:
    """End-to-end tests run spawn.py: generate it from the package first, so that
    editing src/ and running one test file tests the edit (xdist's workers see the
    file their controller wrote: this runs before they start)."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        bundler.write(bundler.bundle())
    except (bundler.BundleError, SyntaxError) as exc:
        pytest.exit(f"bundle: error: {exc} (the end-to-end tests run the spawn.py it writes)", returncode=pytest.ExitCode.USAGE_ERROR)


# Fake but secret-looking: tests assert it never lands in a record.
FAKE_API_KEY = "sk-ant-test-DO-NOT-LEAK-0123456789"

# The scripted model's helpers, as the tests import them from here.
MockModel = mock_model_module.Served
mock_task = mock_model_module.mock_task
spawn_in_bash = mock_model_module.spawn_in_bash
READ_ID = mock_model_module.READ_ID


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: soak-style; left out of `nox -s tests`, run by `nox -s slow`")
    config.addinivalue_line("markers", "ray: needs a local Ray cluster (tools/ray_place.py); run by `nox -s ray` only")


@pytest.fixture
def mock_model(tmp_path: Path) -> Iterator[MockModel]:
    with mock_model_module.serve(tmp_path) as served:
        yield served


@pytest.fixture
def session_root(tmp_path: Path) -> Path:
    return tmp_path / "sessions"


# What nox sets for its session venv. A documented `uv venv` / `uv pip install`
# run under them would aim at the tests' own venv (UV_PYTHON picks its
# interpreter, UV_PROJECT_ENVIRONMENT and VIRTUAL_ENV its folder), not the
# user's new one.
NOX_SESSION_VARS = ("VIRTUAL_ENV", "UV", "UV_PYTHON", "UV_PROJECT_ENVIRONMENT", "UV_RUN_RECURSION_DEPTH", "NOX_CURRENT_SESSION")


def without_nox(env: Mapping[str, str]) -> dict[str, str]:
    """env as a user's own shell has it: none of the variables nox sets for its session."""
    return {k: v for k, v in env.items() if k not in NOX_SESSION_VARS}


@pytest.fixture
def base_env(tmp_path: Path, session_root: Path) -> dict[str, str]:
    """The environment of a user's shell: own HOME, own session root, no SPAWN_* leak."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPAWN_", "ANTHROPIC_", "CLAUDE")) and k != "TRACEPARENT"}
    env.update(
        HOME=str(home),
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        SPAWN_SESSION_ROOT=str(session_root),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def env(base_env: dict[str, str], mock_model: MockModel) -> dict[str, str]:
    """base_env pointed at the scripted model."""
    return {**base_env, "ANTHROPIC_BASE_URL": mock_model.url, "ANTHROPIC_API_KEY": FAKE_API_KEY}


def without_gateway(env: Mapping[str, str]) -> dict[str, str]:
    """env for a tree whose budget is kept from what each CLI reports (no gateway: as under Bedrock, Vertex or
    SPAWN_GATEWAY=0). A test that scripts usage larger than the bytes the model sent needs it: the
    gateway would have cut such a turn short, and tests/test_gateway.py covers the gateway's side."""
    return {**env, "SPAWN_GATEWAY": "0"}


def run_python(
    args: Sequence[str], env: Mapping[str, str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The test interpreter run to its end with these arguments, its output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def run_spawn(
    args: Sequence[str], env: Mapping[str, str], timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_python([str(SPAWN), *args], env, timeout, cwd)


def run_parent_of(bash: str, env: Mapping[str, str], *args: str, child_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """A root ("parent done") whose one child (Bash only, "child done") runs bash: args go to the root, child_args to the child."""
    child = mock_task("child", [{"bash": bash}, {"text": "child done"}])
    parent = mock_task("parent", [{"bash": spawn_in_bash("--task", child, "--tools", "Bash", *child_args)}, {"text": "parent done"}])
    return run_spawn(["--task", parent, "--tools", "Bash", *args], env)


def start_spawn(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SPAWN), *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stdout_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"stdout must be one JSON object, got {proc.stdout!r}; stderr: {proc.stderr}"
    data = json.loads(lines[0])
    assert isinstance(data, dict)
    return data


def agent_dirs(session_root: Path) -> list[Path]:
    return sorted(session_root.glob("*/agents/*"))


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def metas(session_root: Path) -> dict[str, dict[str, Any]]:
    return {d.name: load(d / "meta.json") for d in agent_dirs(session_root) if (d / "meta.json").exists()}


def plant_agent(
    session: Path,
    agent_id: str,
    pid: int,
    *,
    parent_id: str | None = None,
    create_time: float | None = None,
    where: Mapping[str, str] | None = None,
) -> Path:
    """A running agent's record (no outcome, no heartbeat) whose spawn.py and group are pid.

    where: host and boot_id, this host's and boot's unless given.
    """
    spawn = sys.modules["spawn"]
    where = where or {}
    agent_dir = session / spawn.AGENTS_DIR / agent_id
    agent_dir.mkdir(parents=True)
    meta = spawn.AgentMeta(
        id=agent_id, parent_id=parent_id, depth=spawn.id_depth(agent_id) or 0, max_depth=3, pid=pid,
        create_time=psutil.Process(pid).create_time() if create_time is None else create_time, pgid=pid,
        trace_id="1" * 32, span_id="2" * 16, traceparent=f"00-{'1' * 32}-{'2' * 16}-01", task="t", tools=["Read"],
        disallowed_tools=[], model="sonnet", cwd="/", started_at=spawn.utc_now_iso(), session=str(session),
        system_prompt="", background=True,
        pid_namespace=spawn.own_pid_namespace(),  # the same inode as every host's initial namespace
        host=where.get("host", spawn.own_host()), boot_id=where.get("boot_id", spawn.own_boot_id()),
    )  # fmt: skip
    spawn.write_meta(agent_dir, meta, [])
    return Path(agent_dir)


def listed_agents(env: Mapping[str, str], cwd: Path, *, builtin: bool = False) -> list[dict[str, Any]]:
    """`agents list --json` run in cwd: the definitions from files, or with builtin the built-in ones too."""
    rows = stdout_json(run_spawn(["agents", "list", "--json"], env, cwd=cwd))["agents"]
    assert isinstance(rows, list)
    return [row for row in rows if builtin or row["source"] != "built-in"]


def write_agent(project: Path, name: str, frontmatter: str, body: str = "You are a test agent.") -> Path:
    """An agent file in project/.claude/agents; `name: NAME` comes first unless the frontmatter names one."""
    folder = project / ".claude" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    named = any(line.startswith("name:") for line in frontmatter.splitlines())
    head = "" if named else f"name: {name}\n"
    path.write_text(f"---\n{head}{frontmatter.strip()}\n---\n{body}\n")
    return path


# What a planted compiled copy prints: proof that something ran it, and with which argv.
PLANTED = "import sys\nprint('copy ran', sys.argv[1:])\n"


def plant(target: Path, script: Path | None, source: str = PLANTED) -> None:
    """A copy compiled from source, its header forged to claim script's bytes
    (None: left as py_compile writes it, naming no source at all)."""
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    src = target.parent / "planted.py"
    src.write_text(source)
    py_compile.compile(str(src), cfile=str(target), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    src.unlink()
    if script is not None:
        data = target.read_bytes()
        target.write_bytes(data[:8] + importlib.util.source_hash(script.read_bytes()) + data[16:])


def wait_for_ask(session_root: Path, timeout: float = 60) -> dict[str, Any]:
    """The first pending ask in the session root's sessions, once one is written."""
    limit = time.monotonic() + timeout
    while True:
        asks = [p for p in session_root.glob("*/asks/q-*.json") if not p.name.endswith(".answer.json")]
        if asks:
            return load(asks[0])
        assert time.monotonic() < limit, "no agent asked"
        time.sleep(0.05)


def wait_for_path(path: Path, timeout: float = 30) -> None:
    limit = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < limit, f"{path} did not appear"
        time.sleep(0.05)


def listen_unix(path: Path) -> socket.socket:
    """A listening unix socket at path, bound as spawn.py's fork server binds:
    through the directory's fd once the path outgrows sun_path (CI's tmp paths do)."""
    import spawn

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, dir_fd = spawn.unix_address(str(path))
    try:
        listener.bind(address)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    listener.listen()
    return listener


def alive(pids: Iterable[int]) -> list[int]:
    """The pids that still run (a zombie has ended: only its parent hasn't reaped it)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether condition() came true within timeout (looked at every 0.1 s)."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if condition():
            return True
        time.sleep(0.1)
    return False


def wait_until_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait for processes to end; the ones still alive at the timeout."""
    limit = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < limit:
        time.sleep(0.1)
        left = alive(left)
    return left


def validate_records(session_root: Path) -> int:
    """Validate every record under session_root against schemas/; return the count."""
    checker = jsonschema.FormatChecker()

    def check(instance: Any, schema_name: str) -> None:
        schema = json.loads((SCHEMAS / f"{schema_name}.json").read_text())
        jsonschema.Draft202012Validator(schema, format_checker=checker).validate(instance)

    count = 0
    for session in session_root.iterdir():
        if (session / "session.json").exists():
            check(load(session / "session.json"), "session")
            count += 1
        if (session / "limits.json").exists():
            check(load(session / "limits.json"), "limits")
            count += 1
        for ask in sorted((session / "asks").glob("q-*.json")):
            check(load(ask), "ask-answer" if ask.name.endswith(".answer.json") else "ask")
            count += 1
        for attempts in sorted((session / "asks").glob("q-*.attempts.jsonl")):
            for line in attempts.read_text().splitlines():
                check(json.loads(line), "ask-attempt")
                count += 1
        for journal in sorted((session / "dags").glob("*.jsonl")):  # spawn.py dag journals
            for line in journal.read_text().splitlines():
                check(json.loads(line), "dag-journal-line")
                count += 1
        for name, schema_name in (
            ("ledger.jsonl", "ledger-line"),
            ("broker.jsonl", "broker-line"),
            ("forkserver.jsonl", "forkserver-line"),
        ):
            if (session / name).exists():
                for line in (session / name).read_text().splitlines():
                    check(json.loads(line), schema_name)
                    count += 1
    for d in agent_dirs(session_root):
        for name, schema in (("meta.json", "meta"), ("outcome.json", "outcome"), ("heartbeat.json", "heartbeat"), ("kill.json", "kill")):
            if (d / name).exists():
                check(load(d / name), schema)
                count += 1
        if (d / "transcript.jsonl").exists():
            for line in (d / "transcript.jsonl").read_text().splitlines():
                check(json.loads(line), "transcript-line")
                count += 1
        if (d / "native.jsonl").exists():
            for line in (d / "native.jsonl").read_text().splitlines():
                check(json.loads(line), "native-line")
                count += 1
        markers = [m for m in (".done", ".fail") if (d / m).exists()]
        if (d / "outcome.json").exists():
            assert len(markers) == 1, f"{d}: exactly one marker expected, found {markers}"
            status = load(d / "outcome.json")["status"]
            assert markers == [".done" if status == "done" else ".fail"]
    return count


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal (primary, secondary): a process whose stdin is the
    secondary side asks its questions there, as at a person's terminal."""
    import pty

    primary, secondary = pty.openpty()
    yield primary, secondary
    for fd in (primary, secondary):
        with contextlib.suppress(OSError):
            os.close(fd)
