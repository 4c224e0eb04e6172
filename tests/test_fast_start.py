"""Fast start: `python spawn.py` (what `uv run spawn.py` runs) takes the compiled copy
instead of compiling the source, through a start-up hook in its virtual environment,
and never runs a copy that isn't the source's own and the user's."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest
from conftest import ROOT, agent_dirs, listen_unix, load, plant, wait_until
from mock_model import mock_task

import spawn
from spawn import ExitCode

VERSION_LINE = f"spawn.py {spawn.__version__}"
PIPED = "print('from the pipe')\n"


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A throwaway virtual environment that sees the test environment's packages (through a .pth),
    in a cache folder as uv's own environments are (the hook goes into no other uninvited)."""
    cache = tmp_path / "uv-cache"
    cache.mkdir()
    (cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    folder = cache / "environments-v2" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with its own copy of spawn.py, as users have it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "spawn.py").write_bytes(spawn.SCRIPT_PATH.read_bytes())
    return folder


def site_of(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def copy_path(cache: Path, script: Path) -> Path:
    script = script.resolve()
    return cache / spawn.COMPILED_DIR / spawn.compiled_name(script, script.read_bytes())


def run(venv: Path, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "python"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def user_env(base_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**base_env, spawn.ENV_CACHE_DIR: str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}


# The hook that spawn.py installed before its markers (the version at commit
# 69401ab): environments keep it until a spawn.py runs there from source.
OLD_HOOK = ROOT / "tests" / "data" / "fast_start_hook_69401ab.txt"


def hook_functions(text: str = spawn.FAST_START_HOOK) -> dict[str, object]:
    hook: dict[str, object] = {"__name__": "hook_under_test"}  # not FAST_START_MODULE: its functions, without running it
    exec(text.replace("\nmain()\n", "\n"), hook)  # the old hook ends in an unguarded main()
    return hook


def test_the_hook_names_copies_and_finds_the_cache_as_spawn_py_does(tmp_path: Path) -> None:
    hook = hook_functions()
    old = hook_functions(OLD_HOOK.read_text())
    for environ in (
        {spawn.ENV_CACHE_DIR: str(tmp_path / "c")},
        {spawn.ENV_CACHE_DIR: "~/c/", "HOME": str(tmp_path)},
        {"XDG_CACHE_HOME": str(tmp_path / "x"), "HOME": "/nowhere"},
        {"HOME": str(tmp_path / "h")},
        {"XDG_CACHE_HOME": "", "HOME": str(tmp_path / "h")},
    ):
        assert Path(hook["cache_folder"](environ)) == spawn.cache_dir(environ)  # type: ignore[operator]
        assert old["cache_dir"](environ) == hook["cache_folder"](environ)  # type: ignore[operator]  # installed hooks find the same copies
    for path, data in ((Path("/a/spawn.py"), b"x = 1\n"), (Path("/b/spawn.py"), b"x = 1\n"), (Path("/a/spawn.py"), b"x = 2\n")):
        assert hook["compiled_name"](str(path), data) == spawn.compiled_name(path, data)  # type: ignore[operator]
        assert old["compiled_name"](str(path), data) == spawn.compiled_name(path, data)  # type: ignore[operator]
    # The same bytes in two projects are two copies: each finds its own schemas/.
    assert spawn.compiled_name(Path("/a/spawn.py"), b"x") != spawn.compiled_name(Path("/b/spawn.py"), b"x")


def test_a_base_interpreter_is_never_given_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    assert spawn.fast_start_site() is None


def test_a_source_run_installs_the_hook_and_later_runs_take_the_compiled_copy(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    first = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (first.returncode, first.stdout.strip()) == (ExitCode.OK, VERSION_LINE), first.stderr
    site = site_of(venv)
    assert (site / f"{spawn.FAST_START_MODULE}.pth").read_text() == f"import {spawn.FAST_START_MODULE}\n"
    assert (site / f"{spawn.FAST_START_MODULE}.py").read_text() == spawn.FAST_START_HOOK

    plant(copy_path(tmp_path / "cache", project / "spawn.py"), project / "spawn.py")
    hooked = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (hooked.returncode, hooked.stdout.strip(), hooked.stderr) == (0, "copy ran ['--version']", "")
    # Interpreter options and the script's arguments are kept; the path may be given any way.
    hooked = run(venv, ["-X", "utf8", str(project / "spawn.py"), "status", "--json"], user_env, tmp_path)
    assert hooked.stdout.strip() == "copy ran ['status', '--json']", hooked.stderr
    # Other programs in the environment start as usual.
    other = run(venv, ["-c", "print('plain')"], user_env, project)
    assert other.stdout.strip() == "plain"

    off = run(venv, ["spawn.py", "--version"], {**user_env, spawn.ENV_NO_FAST_START: "1"}, project)
    assert off.stdout.strip() == VERSION_LINE


def test_the_copy_runs_in_the_interpreter_the_hook_ran_in_once_site_has_finished(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    """No second interpreter's start: the copy runs in the process the user started,
    after the .pth files that follow the hook's (deps.pth here) and sitecustomize,
    with the copy as argv[0] and __file__, and its exit status."""
    (site_of(venv) / "sitecustomize.py").write_text("import os\nos.environ['SITECUSTOMIZED'] = 'yes'\n")
    assert run(venv, ["spawn.py", "--version"], user_env, project).returncode == ExitCode.OK  # installs the hook
    probe = (
        "import os, sys\n"
        "import jsonschema  # found through deps.pth, which site reads after the hook's .pth\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "print(os.environ.get('SITECUSTOMIZED'), __file__ == sys.argv[0], sys.argv[1:], os.path.basename(cmdline[1]).decode())\n"
        "raise SystemExit(3)\n"
    )
    plant(copy_path(tmp_path / "cache", project / "spawn.py"), project / "spawn.py", probe)
    hooked = run(venv, ["spawn.py", "status", "--json"], user_env, project)
    # The process's command line still names the script: nothing exec'd the copy.
    assert (hooked.returncode, hooked.stdout.strip(), hooked.stderr) == (3, "yes True ['status', '--json'] spawn.py", "")


def test_a_hook_an_earlier_spawn_py_installed_runs_this_versions_copy_until_a_source_run_replaces_it(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path
) -> None:
    site = site_of(venv)
    (site / f"{spawn.FAST_START_MODULE}.py").write_text(OLD_HOOK.read_text())
    (site / f"{spawn.FAST_START_MODULE}.pth").write_text(f"import {spawn.FAST_START_MODULE}\n")
    copy = copy_path(tmp_path / "cache", project / "spawn.py")
    plant(copy, project / "spawn.py")
    hooked = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (hooked.returncode, hooked.stdout.strip(), hooked.stderr) == (0, "copy ran ['--version']", "")
    copy.unlink()  # no copy: the source runs, and puts its own hook in place
    first = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (first.returncode, first.stdout.strip()) == (ExitCode.OK, VERSION_LINE), first.stderr
    assert (site / f"{spawn.FAST_START_MODULE}.py").read_text() == spawn.FAST_START_HOOK


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_a_fifo_or_link_planted_at_the_hooks_names_is_replaced_not_waited_on_or_followed(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path, planted: str
) -> None:
    site = site_of(venv)
    outside = tmp_path / "outside.txt"
    if planted == "fifo":
        # Only at the module's name: a FIFO named *.pth hangs Python's own site, before any script.
        os.mkfifo(site / f"{spawn.FAST_START_MODULE}.py")
    else:
        for name in (f"{spawn.FAST_START_MODULE}.py", f"{spawn.FAST_START_MODULE}.pth"):
            (site / name).symlink_to(outside)
    proc = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (proc.returncode, proc.stdout.strip()) == (ExitCode.OK, VERSION_LINE), proc.stderr
    assert (site / f"{spawn.FAST_START_MODULE}.py").read_text() == spawn.FAST_START_HOOK
    assert not (site / f"{spawn.FAST_START_MODULE}.pth").is_symlink()
    assert not outside.exists()


def test_a_script_read_from_a_fifo_is_left_to_python(venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path) -> None:
    assert run(venv, ["spawn.py", "--version"], user_env, project).returncode == ExitCode.OK  # installs the hook
    fifo = tmp_path / "piped.py"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(fifo), PIPED])
    try:
        proc = run(venv, [str(fifo)], user_env, tmp_path)
    finally:
        writer.wait(timeout=30)
    assert (proc.returncode, proc.stdout.strip()) == (0, "from the pipe"), proc.stderr


DAMAGES = ["world-writable", "group-writable", "foreign-owned", "symlink", "other-content", "folder-world-writable"]


def damage_copy(damage: str, cache: Path, script: Path, tmp_path: Path) -> Path:
    """Put a copy at script's name in cache that must never run, this way; returns its path."""
    target = copy_path(cache, script)
    if damage == "world-writable":
        plant(target, script)
        target.chmod(0o666)
    elif damage == "group-writable":
        plant(target, script)
        target.chmod(0o620)
    elif damage == "foreign-owned":
        if os.getuid() != 0:
            pytest.skip("giving a file to another user needs root")
        plant(target, script)
        os.chown(target, 65534, 65534)  # nobody's
    elif damage == "symlink":
        elsewhere = tmp_path / "elsewhere.pyc"
        plant(elsewhere, script)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        target.unlink(missing_ok=True)
        target.symlink_to(elsewhere)
    elif damage == "another-path":
        # A copy made for the same bytes in another project.
        other = tmp_path / "other" / "spawn.py"
        other.parent.mkdir()
        other.write_bytes(script.read_bytes())
        plant(copy_path(cache, other), other)
    elif damage == "edited-source":
        plant(target, script)
        script.write_bytes(script.read_bytes() + b"# edited\n")
    elif damage == "other-content":
        plant(target, None)  # the right name, but compiled from another source
    else:
        plant(target, script)
        target.parent.chmod(0o777)
    return target


@pytest.mark.parametrize("damage", [*DAMAGES, "another-path", "edited-source"])
def test_a_copy_that_isnt_the_sources_own_and_the_users_is_never_run(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path, damage: str
) -> None:
    assert run(venv, ["spawn.py", "--version"], user_env, project).returncode == ExitCode.OK  # installs the hook
    damage_copy(damage, tmp_path / "cache", project / "spawn.py", tmp_path)
    proc = run(venv, ["spawn.py", "--version"], user_env, project)
    assert (proc.returncode, proc.stdout.strip()) == (ExitCode.OK, VERSION_LINE), proc.stderr


@pytest.mark.parametrize("damage", ["genuine", *DAMAGES])
def test_the_hook_trusts_a_copy_exactly_as_spawn_py_does(tmp_path: Path, project: Path, damage: str) -> None:
    """Unit test: the hook's text as spawn.py writes it, and as earlier versions installed it, trust what spawn.py trusts."""
    script = project / "spawn.py"
    cache = tmp_path / "cache"
    target = copy_path(cache, script) if damage == "genuine" else damage_copy(damage, cache, script, tmp_path)
    if damage == "genuine":
        plant(target, script)
    source = script.read_bytes()
    hook = hook_functions()["copy_is_trusted"]
    old = hook_functions(OLD_HOOK.read_text())["copy_is_trusted"]
    trusted = spawn.copy_is_trusted(target.parent, target, source)
    assert hook(str(target.parent), str(target), source) == trusted == (damage == "genuine")  # type: ignore[operator]
    assert old(str(target.parent), str(target), source) == trusted  # type: ignore[operator]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_copy_that_isnt_the_sources_own_and_the_users_is_never_handed_to_children(
    venv: Path, project: Path, env: dict[str, str], tmp_path: Path, damage: str
) -> None:
    """$SPAWN_PY, which every agent's Bash runs as it is, is a copy checked and compiled afresh."""
    session_root = Path(env[spawn.ENV_SESSION_ROOT])
    env = {**env, spawn.ENV_CACHE_DIR: str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1"}
    target = damage_copy(damage, tmp_path / "cache", project / "spawn.py", tmp_path)
    task = mock_task("runs SPAWN_PY", [{"bash": '"$SPAWN_PYTHON" "$SPAWN_PY" --version'}, {"text": "root-result"}])
    proc = run(venv, ["spawn.py", "--task", task, "--tools", "Bash"], env, project)
    assert proc.returncode == ExitCode.OK, proc.stderr
    (agent_dir,) = agent_dirs(session_root)
    transcript = (agent_dir / "transcript.jsonl").read_text()
    assert "copy ran" not in transcript and VERSION_LINE in transcript
    assert spawn.copy_is_trusted(target.parent, target, (project / "spawn.py").read_bytes())  # compiled afresh


def test_nested_spawns_written_as_source_runs_go_through_the_hook(
    venv: Path, project: Path, env: dict[str, str], tmp_path: Path, session_root: Path
) -> None:
    """A real tree whose agents start children as users write it (the source, not SPAWN_PY)."""
    env = {**env, spawn.ENV_CACHE_DIR: str(tmp_path / "cache")}
    python = shlex.quote(str(venv / "bin" / "python"))
    child_task = mock_task("hooked child", [{"text": "child-result"}])
    child = f"{python} {shlex.quote(str(project / 'spawn.py'))} --tools Read --task {shlex.quote(child_task)}"
    task = mock_task("hooked root", [{"bash": child}, {"text": "root-result"}])
    proc = run(venv, ["spawn.py", "--task", task, "--tools", "Bash,Read", "--max-depth", "1"], env, project)
    assert proc.returncode == ExitCode.OK, proc.stderr
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert {depth: o["status"] for depth, o in outcomes.items()} == {0: "done", 1: "done"}
    # One compiled copy, named for this project's spawn.py, not the repository's.
    copies = list((tmp_path / "cache" / spawn.COMPILED_DIR).glob("spawn-*.pyc"))
    assert copies == [copy_path(tmp_path / "cache", project / "spawn.py")]
    assert copy_path(tmp_path / "cache", ROOT / "spawn.py") not in copies


def test_the_hook_finds_the_stand_in_section_once_and_it_runs_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook compiles the stand-in from the script's own bytes: the section
    must be there exactly once, and need nothing from the rest of the file."""
    source = spawn.SCRIPT_PATH.read_bytes()
    start, end = spawn.STAND_IN_BEGIN, spawn.STAND_IN_END
    assert (source.count(start), source.count(end)) == (1, 1)
    assert source.index(start) < source.index(end) < source.index(b"\nimport argparse\n")
    stand_in = hook_functions()["hook_stand_in"]
    # A session with no server: it returns (the copy runs next), having run
    # the section's code as it is in the file.
    monkeypatch.setenv(spawn.ENV_SESSION, str(tmp_path))
    monkeypatch.setattr(sys, "argv", [str(spawn.SCRIPT_PATH), "--task", "t", "--tools", "Read"])
    assert stand_in(str(spawn.SCRIPT_PATH), source) is None  # type: ignore[operator]
    # A script without the section, or with a broken one, is left to its copy.
    assert stand_in(str(spawn.SCRIPT_PATH), source.replace(end, b"\n")) is None  # type: ignore[operator]
    broken = source.replace(b"def forkserver_stand_in(", b"def forkserver_stand_in((", 1)
    assert stand_in(str(spawn.SCRIPT_PATH), broken) is None  # type: ignore[operator]


def test_the_stand_in_still_has_what_hooks_of_earlier_versions_look_for_unit() -> None:
    """The hook of 69401ab finds the stand-in by its banner and its closing call: both are still there, once,
    around the same code, so such a hook keeps handing nested spawns to the fork server."""
    finds = [n for n in ast.walk(ast.parse(OLD_HOOK.read_text())) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "find"]
    old_start, old_end = (ast.literal_eval(call.args[0]) for call in finds[:2])
    source = spawn.SCRIPT_PATH.read_bytes()
    assert (source.count(old_start), source.count(old_end)) == (1, 1)
    assert source.index(spawn.STAND_IN_BEGIN) < source.index(old_start) < source.index(spawn.STAND_IN_END) < source.index(old_end)


@pytest.mark.parametrize("hook", ["current", "installed-by-69401ab"])
def test_the_hook_hands_a_nested_spawn_to_the_fork_server_without_loading_the_copy(
    venv: Path, project: Path, env: dict[str, str], tmp_path: Path, session_root: Path, *, hook: str
) -> None:
    """A nested `python spawn.py` (what `uv run spawn.py` runs) is served from
    the hook: the compiled copy is replaced by one that only prints, before
    the child starts, and the child is still a real agent that the session's
    fork server ran. A hook an earlier spawn.py installed, put back after the
    root (a source run) installed today's, still finds the stand-in."""
    env = {**env, spawn.ENV_CACHE_DIR: str(tmp_path / "cache")}
    python = shlex.quote(str(venv / "bin" / "python"))
    script = project / "spawn.py"
    planted = tmp_path / "planted" / "planted.pyc"
    plant(planted, script)
    copy = shlex.quote(str(copy_path(tmp_path / "cache", script)))
    replace_copy = f"cp {shlex.quote(str(planted))} {copy}"
    child_task = mock_task("handed child", [{"text": "child-result"}])
    child = f"{python} {shlex.quote(str(script))} --tools Read --task {shlex.quote(child_task)}"
    wait_for_server = f'for i in $(seq 600); do [ -S "${spawn.ENV_SESSION}/{spawn.FORKSERVER_SOCKET}" ] && break; sleep 0.05; done'
    # The real copy is put back once the child has run: the root's guard runs
    # it after the root exits, to end the tree's cgroup (a planted copy would
    # leave that cgroup behind on the machine).
    bash = f"{wait_for_server}; cp -p {copy} {copy}.real && {replace_copy} && {child}; mv {copy}.real {copy}"
    if hook != "current":
        installed = shlex.quote(str(site_of(venv) / f"{spawn.FAST_START_MODULE}.py"))
        bash = f"cp {shlex.quote(str(OLD_HOOK))} {installed} && {bash}"
    task = mock_task("hooked root", [{"bash": bash}, {"text": "root-result"}])
    proc = run(venv, ["spawn.py", "--task", task, "--tools", "Bash,Read", "--max-depth", "1"], env, project)
    assert proc.returncode == ExitCode.OK, proc.stderr
    outcomes = {load(d / "meta.json")["depth"]: load(d / "outcome.json") for d in agent_dirs(session_root)}
    assert {depth: o["status"] for depth, o in outcomes.items()} == {0: "done", 1: "done"}
    assert outcomes[1]["output"] == "child-result"
    root_meta = next(load(d / "meta.json") for d in agent_dirs(session_root) if load(d / "meta.json")["depth"] == 0)
    if str(root_meta["containment"]).startswith("cgroup "):
        cgroup = Path(str(root_meta["containment"]).removeprefix("cgroup "))
        assert wait_until(lambda: not cgroup.exists(), 10), f"the root's guard left {cgroup}"
    forked = [json.loads(line) for log in session_root.glob(f"*/{spawn.FORKSERVER_LOG}") for line in log.read_text().splitlines()]
    assert [f["verb"] for f in forked] == ["run"]
    assert "copy ran" not in "".join(p.read_text(errors="replace") for p in session_root.rglob("transcript.jsonl"))


@pytest.mark.parametrize("server", ["none", "off", "refusing"])
def test_a_nested_spawn_the_hook_cant_hand_over_runs_its_compiled_copy(
    venv: Path, project: Path, user_env: dict[str, str], tmp_path: Path, server: str
) -> None:
    """No socket, SPAWN_NO_FORKSERVER=1, or a server that refuses: the copy runs, as before the hand-over."""
    assert run(venv, ["spawn.py", "--version"], user_env, project).returncode == ExitCode.OK  # installs the hook
    plant(copy_path(tmp_path / "cache", project / "spawn.py"), project / "spawn.py")
    session = tmp_path / "session"
    session.mkdir()
    env = {**user_env, spawn.ENV_SESSION: str(session)}
    if server == "off":
        env[spawn.ENV_NO_FORKSERVER] = "1"
    listener = None
    asked: list[bytes] = []
    if server in ("off", "refusing"):
        listener = listen_unix(session / spawn.FORKSERVER_SOCKET)

        def refuse() -> None:
            assert listener is not None
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    asked.append(conn.recv(1 << 16))
                    conn.sendall(b'{"refused": "test"}\n')

        threading.Thread(target=refuse, daemon=True).start()
    try:
        proc = run(venv, ["spawn.py", "--task", "t", "--tools", "Read"], env, project)
    finally:
        if listener is not None:
            listener.close()
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "copy ran ['--task', 't', '--tools', 'Read']", "")
    # Only a refusing server was asked, once: by the hook (the planted copy asks nothing).
    assert len(asked) == (1 if server == "refusing" else 0)
