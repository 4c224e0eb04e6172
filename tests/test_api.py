"""The Python API (`import spawn`): spawn.run, start, wait, status, kill, send, budget and their async twins.

End to end: every call runs the real spawn.py CLI, which runs the real bundled
claude CLI against tools/mock_model.py; and from a fresh virtual environment
that installed the project, the installed module is what runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import mock_model
import psutil
import pytest
from conftest import ROOT, agent_dirs, alive, load, metas, mock_task, run_spawn, wait_for_path, wait_until_gone

import spawn

EXAMPLE = ROOT / "docs" / "examples" / "review_table.py"
ASLEEP: list[dict[str, Any]] = [{"sleep": 120}, {"text": "woke up"}]  # a model request that hangs: the agent runs until ended


def run_flags() -> dict[str, argparse.Action]:
    return {a.dest: a for a in spawn.build_run_parser()._actions if a.option_strings}


# ---- options: the CLI's flags, one list ----


def test_every_run_flag_is_a_keyword_or_left_out_with_a_reason() -> None:
    keywords = set(spawn.RunOptions.__annotations__)
    flags = set(run_flags())
    assert keywords <= flags, f"keywords with no flag: {keywords - flags}"
    unexplained = flags - keywords - set(spawn.API_LEFT_OUT)
    assert not unexplained, f"flags with neither a keyword nor a reason: {unexplained}"
    assert not keywords & set(spawn.API_LEFT_OUT)
    assert all(len(why) > 10 for why in spawn.API_LEFT_OUT.values())


def test_each_keyword_takes_what_its_flag_takes() -> None:
    hints = typing.get_type_hints(spawn.RunOptions)
    for dest, action in run_flags().items():
        if dest not in hints:
            continue
        hint = hints[dest]
        if action.choices is not None:
            assert set(typing.get_args(hint)) == set(action.choices), dest
        elif action.type in (int, float):
            assert hint is action.type, f"{dest}: {hint} for a flag of type {action.type}"
        elif isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction):
            assert hint is bool, dest
        elif isinstance(action, argparse._AppendAction):
            assert hint == list[str], dest


def test_keywords_become_the_flags_the_cli_parses(tmp_path: Path) -> None:
    options: dict[str, Any] = {
        "topic": "api words",
        "resume": "a0-123456",
        "tools": ["Read", "Grep"],
        "disallowed_tools": ["Bash"],
        "allow": ["Bash(git diff:*)", "Read"],
        "deny": ["Bash(rm:*)"],
        "ask": ["Edit"],
        "model": "low-tier",
        "agent": "reviewer",
        "schema": {"type": "object", "required": ["x"]},
        "output": tmp_path / "out.json",
        "system_prompt": "be brief",
        "system_prompt_file": str(tmp_path / "prompt.md"),
        "preset": "claude_code",
        "sandbox": "off",
        "cwd": tmp_path,
        "max_depth": 3,
        "timeout": 12.5,
        "idle_timeout": 30.0,
        "max_turns": 4,
        "max_budget_usd": 0.25,
        "on_budget": "pause",
        "placement": "auto",
        "no_wait": True,
        "max_agents": 9,
        "max_concurrent": 2,
        "confirm_over": 1.5,
        "session": tmp_path / "sessions",
        "parent_trace": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        "no_settings": True,
    }
    assert set(options) == set(spawn.RunOptions.__annotations__)  # every keyword, once
    parsed = spawn.build_run_parser().parse_args(spawn.options_argv(options))
    for key, value in options.items():
        if key == "schema":
            assert json.loads(parsed.schema) == value
        elif key in ("tools", "disallowed_tools"):
            assert getattr(parsed, key) == ",".join(value)
        elif isinstance(value, Path):
            assert getattr(parsed, key) == str(value)
        else:
            assert getattr(parsed, key) == value, key
    assert spawn.options_argv({"tools": [], "max_turns": None}) == ["--tools="]  # None: as if not given
    dashed = spawn.build_run_parser().parse_args(spawn.run_argv("- a task in a list", {"topic": "--not-a-flag", "deny": ["-x"]}, True))
    assert (dashed.task, dashed.topic, dashed.deny, dashed.background) == ("- a task in a list", "--not-a-flag", ["-x"], True)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"toolz": ["Read"]}, "unknown option toolz=['Read']; did you mean 'tools'?"),
        ({"tools": "Read"}, "tools='Read' must be a list of strings"),
        ({"allow": ["Read", 3]}, "must hold strings only"),
        ({"timeout": True}, "timeout=True takes a value, not True or False"),
        ({"no_settings": "yes"}, "no_settings='yes' must be True or False"),
        ({"dry_run": True}, "dry_run is no option of the Python API"),
        ({"timeout": [1]}, "timeout=[1] has the wrong type"),
    ],
)
def test_a_bad_keyword_is_a_usage_error_and_starts_nothing(
    options: dict[str, Any], words: str, base_env: dict[str, str], session_root: Path
) -> None:
    with pytest.raises(spawn.UsageError) as caught:
        spawn.run("anything", env=base_env, **options)
    assert caught.value.exit_code == spawn.ExitCode.USAGE and words in caught.value.message
    assert not session_root.exists()


@pytest.mark.parametrize("name", ["run", "start", "wait", "status", "kill", "send", "budget"])
def test_each_call_has_an_async_twin_that_takes_the_same_arguments(name: str) -> None:
    call, twin = getattr(spawn, name), getattr(spawn, "await_" if name == "wait" else f"a{name}")
    assert not inspect.iscoroutinefunction(call) and inspect.iscoroutinefunction(twin)
    assert inspect.signature(call).parameters == inspect.signature(twin).parameters
    assert typing.get_type_hints(call) == typing.get_type_hints(twin)


def test_budget_takes_exactly_one_change() -> None:
    with pytest.raises(spawn.UsageError, match="exactly one"):
        spawn.budget("/nowhere")
    with pytest.raises(spawn.UsageError, match="exactly one"):
        spawn.budget("/nowhere", raise_usd=1.0, set_usd=2.0)


def test_a_cli_run_never_executes_the_api() -> None:
    # Every agent at every depth runs spawn.py as a script: the API's definitions
    # come after the __main__ block that ends that process, so they cost it nothing.
    text = (ROOT / "spawn.py").read_text()
    api_begins = text.index("# ==================== begin src/spawnlib/cli/api.py")
    assert api_begins > text.index('\nif __name__ == "__main__":\n    console_main()\n')
    assert "os._exit(" in inspect.getsource(spawn.console_main)  # the process ends there


def schema_properties(name: str, *path: str) -> tuple[set[str], set[str]]:
    schema = json.loads((ROOT / "schemas" / f"{name}.json").read_text())
    for key in path:
        schema = schema[key]
    return set(schema["properties"]), set(schema["required"])


@pytest.mark.parametrize(
    ("record", "schema", "path"),
    [
        (spawn.Result, "result", ()),
        (spawn.AgentRow, "status", ("properties", "agents", "items")),
        (spawn.ModelCall, "status", ("properties", "agents", "items", "properties", "model_calls", "items")),
    ],
)
def test_the_records_mirror_their_schemas(record: type, schema: str, path: tuple[str, ...]) -> None:
    properties, required = schema_properties(schema, *path)
    fields = dataclasses.fields(record)
    assert {f.name for f in fields} == properties
    assert {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING} == required


# ---- end to end: the real CLI against the scripted model ----


def test_run_returns_the_agents_result(env: dict[str, str], session_root: Path) -> None:
    result = spawn.run(mock_task("say hi", [{"text": "hello from the agent"}]), env=env, tools=["Read"], timeout=120.0)
    assert isinstance(result, spawn.Result)
    assert result.status is spawn.Status.DONE and result.ok and result.exit_code == spawn.ExitCode.OK
    assert result.output == "hello from the agent"
    assert isinstance(result.cost_usd, float) and result.cost_usd > 0
    (agent_dir,) = agent_dirs(session_root)
    assert result.agent_dir == str(agent_dir) and result.id == agent_dir.name
    outcome = result.read_outcome()
    assert isinstance(outcome, spawn.Outcome)
    assert (outcome.status, outcome.output, outcome.cost_usd) == ("done", result.output, result.cost_usd)
    assert load(agent_dir / "meta.json")["tools"] == ["Read"]


def test_a_schema_given_as_a_dict_validates_the_output(env: dict[str, str]) -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    result = spawn.run(mock_task("count", [{"structured": {"n": 7}}]), env=env, tools=["Read"], schema=schema)
    assert result.status is spawn.Status.DONE and result.output == {"n": 7}
    bad = spawn.run(mock_task("count badly", [{"structured": {"n": "seven"}}]), env=env, tools=["Read"], schema=schema)
    # An agent that failed is an answer, not an exception: its status says so.
    assert bad.status is spawn.Status.FAILED and bad.exit_code == spawn.ExitCode.AGENT_FAILED and bad.validation_errors


def cli_error(args: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    proc = run_spawn(args, env)
    return proc.returncode, proc.stderr.strip().splitlines()[-1].removeprefix("spawn: error: ")


def test_errors_are_the_clis_with_its_message_and_exit_code(env: dict[str, str], tmp_path: Path) -> None:
    task = mock_task("never runs", [{"text": "no"}])
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    cases: list[tuple[type[spawn.SpawnError], dict[str, Any], list[str], dict[str, str]]] = [
        (spawn.UsageError, {"tools": ["Nope"]}, ["--tools", "Nope"], env),
        (spawn.UsageError, {"max_depth": -1}, ["--max-depth", "-1"], env),
        (spawn.StateError, {"session": a_file / "sessions"}, ["--session", str(a_file / "sessions")], env),
        # A depth limit: the refusal is recorded, and the API raises what the CLI reports.
        (spawn.RefusedError, {}, [], {**env, "SPAWN_DEPTH": "2", "SPAWN_MAX_DEPTH": "2"}),
    ]
    for error_class, options, flags, call_env in cases:
        tools = [] if "tools" in options else ["--tools", "Read"]
        code, message = cli_error(["--task", task, *tools, *flags], call_env)
        with pytest.raises(error_class) as caught:
            spawn.run(task, env=call_env, **({"tools": ["Read"]} | options))
        assert caught.value.exit_code == code == error_class.exit_code, (error_class, code)
        if error_class is spawn.RefusedError:  # each refusal names its own agent directory
            assert caught.value.message.startswith("refused: depth limit") and message.startswith("refused: depth limit")
        else:
            assert caught.value.message == message


def test_start_wait_status_and_kill(env: dict[str, str], session_root: Path) -> None:
    quick = spawn.start(mock_task("quick", [{"text": "quick done"}]), env=env, tools=["Read"])
    sleeper = spawn.start(mock_task("sleeper", ASLEEP), env=env, tools=["Read"])
    assert isinstance(quick, spawn.Agent) and quick.status is spawn.Status.RUNNING
    assert Path(quick.agent_dir).is_dir() and quick.session != sleeper.session  # two roots, two sessions

    first = spawn.wait([quick, sleeper], any=True, env=env)
    assert first.status == "done" and [r.id for r in first.agents] == [quick.id] and first.agents[0].output == "quick done"
    late = spawn.wait(sleeper, timeout=0.5, env=env)
    assert (late.status, late.agents, late.pending) == ("timeout", [], [sleeper.id])

    rows = spawn.status(sleeper, env=env)
    assert [(r.id, r.state, r.depth, r.parent_id) for r in rows] == [(sleeper.id, spawn.Status.RUNNING, 0, None)]
    assert all(isinstance(r, spawn.AgentRow) for r in rows)
    listed = run_spawn(["status", "--json", str(sleeper.session)], env)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "status.json").read_text())).validate(json.loads(listed.stdout))
    # No budget, no gateway: no model calls are metered, and the rows look as they always did.
    assert all("model_calls" not in row for row in json.loads(listed.stdout)["agents"]) and rows[0].model_calls is None
    runner = load(Path(sleeper.agent_dir) / "meta.json")["pid"]
    assert alive([runner])

    assert sleeper.kill() == [sleeper.id]
    ended = sleeper.result(timeout=60)
    assert ended.status is spawn.Status.KILLED and ended.exit_code == spawn.ExitCode.KILLED
    assert wait_until_gone([runner], 30) == []
    both = spawn.wait([quick.id, sleeper.agent_dir], env=env)  # an id or a directory names an agent too
    assert both.status == "failed" and [r.status for r in both.agents] == [spawn.Status.DONE, spawn.Status.KILLED]
    assert [r.state for r in spawn.status(env={**env, "SPAWN_SESSION_ROOT": str(session_root)})] == [spawn.Status.KILLED]


def test_async_twins(env: dict[str, str]) -> None:
    async def main() -> None:
        tasks = [mock_task(f"async {n}", [{"text": f"answer {n}"}]) for n in range(3)]
        results = await asyncio.gather(*(spawn.arun(task, env=env, tools=["Read"]) for task in tasks))
        assert [r.output for r in results] == ["answer 0", "answer 1", "answer 2"]
        agent = await spawn.astart(mock_task("async sleeper", ASLEEP), env=env, tools=["Read"])
        rows = await spawn.astatus(agent, env=env)
        assert [r.state for r in rows] == [spawn.Status.RUNNING]
        assert await spawn.akill(agent, env=env) == [agent.id]
        waited = await spawn.await_(agent, env=env)
        assert [r.status for r in waited.agents] == [spawn.Status.KILLED]
        with pytest.raises(spawn.UsageError):
            await spawn.arun("x", env=env, tools=["Nope"])

    asyncio.run(main())


def test_a_cancelled_arun_ends_its_agent_with_an_outcome(env: dict[str, str], session_root: Path) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(spawn.arun(mock_task("to cancel", ASLEEP), env=env, tools=["Read"]))
        limit = time.monotonic() + 60
        while not list(session_root.glob("*/agents/*/heartbeat.json")):
            assert time.monotonic() < limit, "the agent never started"
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (agent_dir,) = agent_dirs(session_root)
    outcome = load(agent_dir / "outcome.json")  # written before arun gave up waiting: one outcome, not an orphan
    assert outcome["status"] == "interrupted"
    assert wait_until_gone([load(agent_dir / "meta.json")["pid"]], 30) == []


def test_from_an_agents_bash_the_api_starts_children_within_its_limits(env: dict[str, str], session_root: Path, tmp_path: Path) -> None:
    # A script an agent runs spawns through the API as the agent's Bash would through the CLI:
    # its agents are that agent's children, and a limit refuses them just the same.
    script = tmp_path / "fan_out.py"
    script.write_text(
        "import sys\n"
        "import spawn\n"
        "try:\n"
        "    result = spawn.run(sys.argv[1], tools=['Bash', 'Read'])\n"
        "    print('api-result', result.status, result.output)\n"
        "except spawn.RefusedError as error:\n"
        "    print('api-refused', int(error.exit_code), error.message)\n"
    )
    run_script = f'"$SPAWN_PYTHON" {script}'
    too_deep = mock_task("too deep", [{"text": "must never run"}])
    child = mock_task("child", [{"bash": f"{run_script} {shlex.quote(too_deep)}"}, {"text": "child-saw-refusal"}])
    root = mock_task("root", [{"bash": f"{run_script} {shlex.quote(child)}"}, {"text": "root-done"}])
    result = spawn.run(root, env={**env, "PYTHONPATH": str(ROOT)}, tools=["Bash", "Read"], max_depth=1)
    assert (result.status, result.output) == (spawn.Status.DONE, "root-done")
    by_depth = {m["depth"]: m for m in metas(session_root).values()}
    assert sorted(by_depth) == [0, 1, 2] and by_depth[1]["parent_id"] == by_depth[0]["id"] == result.id
    refused = next(session_root.glob(f"*/agents/{by_depth[2]['id']}"))
    assert load(refused / "outcome.json")["status"] == "refused"
    transcripts = {d: next(session_root.glob(f"*/agents/{by_depth[d]['id']}")).joinpath("transcript.jsonl").read_text() for d in (0, 1)}
    assert "api-refused 4 refused: depth limit" in transcripts[1]
    assert "api-result done child-saw-refusal" in transcripts[0]


@pytest.mark.parametrize("started_with", ["SIG_DFL", "SIG_IGN"])
def test_an_interrupted_run_ends_its_agent_with_an_outcome(
    env: dict[str, str], session_root: Path, tmp_path: Path, started_with: str
) -> None:
    # As a notebook's interrupt: SIGINT to the Python process alone, not to its spawn.py.
    # A notebook's kernel handles SIGINT whatever it inherited; a plain script started from
    # a suite run with SIGINT ignored (nohup, `&` in a script, some CI shells) would
    # inherit SIG_IGN and never see the interrupt, so it sets the handler as a kernel does.
    script = tmp_path / "notebook.py"
    script.write_text(
        "import signal, sys, spawn\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "try:\n"
        f"    spawn.run({mock_task('to interrupt', ASLEEP)!r}, tools=['Read'])\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    # What the suite's shell passed down: an ignored signal stays ignored across exec.
    launch = (
        f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{started_with}); "
        f"os.execv(sys.executable, [sys.executable, {str(script)!r}])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launch], env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        limit = time.monotonic() + 60
        while not list(session_root.glob("*/agents/*/heartbeat.json")):
            assert time.monotonic() < limit and proc.poll() is None, "the agent never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        end_with_its_runs(proc)
    assert out.strip() == "interrupted", err
    (agent_dir,) = agent_dirs(session_root)
    assert load(agent_dir / "outcome.json")["status"] == "interrupted"  # committed before run() gave up
    assert wait_until_gone([load(agent_dir / "meta.json")["pid"]], 30) == []


def end_with_its_runs(proc: subprocess.Popen[str]) -> None:
    """A test's Python process that is still running, ended with the spawn.py runs it started (their stop path ends their agents)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(psutil.Error):
        runs = psutil.Process(proc.pid).children()
        for run in runs:
            run.terminate()
        psutil.wait_procs(runs, timeout=30)
    proc.kill()
    proc.communicate()


def needs_steering_verbs(env: Mapping[str, str]) -> None:
    if run_spawn(["send", "--help"], env).returncode != 0:
        pytest.skip("needs the send/budget verbs")


def test_send_reaches_a_running_agent(env: dict[str, str]) -> None:
    needs_steering_verbs(env)
    agent = spawn.start(mock_task("listen", [{"bash": "sleep 3"}, {"text": "heard"}]), env=env, tools=["Bash"])
    wait_for_path(Path(agent.agent_dir) / "heartbeat.json", 60)
    answer = agent.send("- a word from python", as_name="notebook")  # a dash first: still the message
    assert answer["sent"] is True
    result = agent.result(timeout=120)
    assert result.status is spawn.Status.DONE
    assert "- a word from python" in Path(result.transcript).read_text()


def test_budget_raises_a_trees_budget(env: dict[str, str]) -> None:
    needs_steering_verbs(env)
    agent = spawn.start(mock_task("spend", ASLEEP), env=env, tools=["Read"], max_budget_usd=0.5)
    try:
        limits = agent.session / "limits.json"
        wait_for_path(limits, 60)
        assert isinstance(spawn.budget(agent.session, raise_usd=0.25, env=env), dict)
        assert load(limits)["max_budget_usd"] == pytest.approx(0.75)
        spawn.budget(agent.session, set_usd=2.0, env=env)
        assert load(limits)["max_budget_usd"] == pytest.approx(2.0)
    finally:
        agent.kill()


# ---- the installed distribution ----


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment where `uv pip install ROOT` installed the project, offline (from uv's cache)."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to install the project (nox uses it)"
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [uv, "pip", "install", "--offline", "--quiet", "--python", str(python), str(ROOT)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return python


def run_installed(python: Path, code: str, env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # From a folder of its own: nothing beside it named spawn.py, and no PYTHONPATH.
    clean = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", code], env=clean, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_spawn_run_from_a_fresh_venv_that_installed_the_project(installed: Path, env: dict[str, str], tmp_path: Path) -> None:
    code = (
        "import json, spawn\n"
        f"result = spawn.run({mock_task('installed', [{'text': 'from site-packages'}])!r}, tools=['Read'])\n"
        "print(json.dumps({'file': spawn.__file__, 'status': result.status, 'output': result.output}))\n"
    )
    proc = run_installed(installed, code, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    site = Path(data["file"]).parent
    assert site.parent.name == "site-packages" and Path(data["file"]).is_relative_to(installed.parent.parent)
    assert (data["status"], data["output"]) == ("done", "from site-packages")
    # The same file users copy, marked typed (PEP 561).
    assert Path(data["file"]).read_bytes() == (ROOT / "spawn.py").read_bytes()
    assert (site / "py.typed").exists()


def test_the_installed_spawn_command_is_the_cli_and_sessions_go_to_the_working_directory(
    installed: Path, env: dict[str, str], tmp_path: Path
) -> None:
    # No SPAWN_SESSION_ROOT: an installed spawn has no project beside it, so the run's
    # session goes to sessions/ in the working directory, never into site-packages.
    own = {k: v for k, v in env.items() if k != "SPAWN_SESSION_ROOT"}
    command = installed.parent / "spawn"
    version = subprocess.run([str(command), "--version"], env=own, capture_output=True, text=True, timeout=120, check=False)
    assert (version.returncode, version.stdout.strip()) == (spawn.ExitCode.OK, f"spawn.py {spawn.__version__}")
    proc = subprocess.run(
        [str(command), "--task", mock_task("console", [{"text": "from the command"}]), "--tools", "Read"],
        env=own, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    result = json.loads(proc.stdout)
    assert result["output"] == "from the command"
    assert Path(result["agent_dir"]).is_relative_to(tmp_path / "sessions")
    bad = subprocess.run(
        [str(command), "--task", "x", "--max-depth", "-1"], env=own, capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode == spawn.ExitCode.USAGE and bad.stderr.startswith("spawn: error: --max-depth")
    site = installed.parent.parent / "lib"
    assert not list(site.glob("python*/site-packages/spawn/sessions"))


def test_the_example_prints_a_table_of_five_reviews(installed: Path, base_env: dict[str, str], tmp_path: Path) -> None:
    aspects = ["correctness", "security", "performance", "tests", "readability"]
    rules = [
        {
            "match": f"Review the {aspect} of",
            "steps": [{"structured": {"verdict": "comment", "issues": [{"severity": "minor", "description": aspect}] * (n + 1)}}],
        }
        for n, aspect in enumerate(aspects)
    ]
    with mock_model.serve(tmp_path, {"rules": rules}) as model:
        env = {**base_env, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-test-example"}
        proc = subprocess.run(
            [str(installed), str(EXAMPLE), "src/"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
        )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["aspect", "status", "verdict", "issues", "cost"]
    table = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(table)[:5] == aspects and "total" in table
    for n, aspect in enumerate(aspects):
        assert table[aspect][1:4] == ["done", "comment", str(n + 1)]
        assert table[aspect][4].startswith("$")


def test_pyproject_installs_what_the_script_block_names() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    block = (ROOT / "spawn.py").read_text().split("# /// script\n", 1)[1].split("# ///\n", 1)[0]
    script = tomllib.loads("\n".join(line.removeprefix("#").removeprefix(" ") for line in block.splitlines()))
    assert project["project"]["dependencies"] == script["dependencies"]
    assert project["project"]["requires-python"] == script["requires-python"]
    assert "version" in project["project"]["dynamic"] and project["tool"]["hatch"]["version"]["path"] == "spawn.py"
    assert project["project"]["scripts"]["spawn"] == "spawn:console_main" and callable(spawn.console_main)


def test_the_docs_show_the_example_that_the_test_runs() -> None:
    code = EXAMPLE.read_text()
    body = code[code.index("import spawn\n") : code.index('\n\nif __name__ == "__main__":')]
    assert body in (ROOT / "docs" / "python-api.md").read_text()


def test_uv_run_spawn_py_ignores_the_project_beside_it() -> None:
    # spawn.py is a PEP 723 script: with pyproject.toml beside it, uv still runs it
    # from its own block (offline: from the cache nox filled), and makes no project venv.
    uv = shutil.which("uv")
    assert uv is not None
    before = {p.name for p in ROOT.iterdir()}
    argv = [uv, "run", "--offline", "spawn.py", "--version"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"spawn.py {spawn.__version__}"
    assert {p.name for p in ROOT.iterdir()} - before == set()  # no .venv, no uv.lock
