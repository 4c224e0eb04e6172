"""A user's first week (issue 46): the names, files, graphs and options a user
brings from Claude Code and the docs, accepted or refused as the pinned CLI and
the docs say.

The model-name tests read the pinned CLI's own alias list out of its binary, so
a CLI upgrade that adds an alias fails here instead of in a user's agent file.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from conftest import ROOT, SPAWN, MockModel, mock_task, patch_name, run_spawn, stdout_json, without_nox, write_agent

import spawn

# An array literal of short quoted names, as the CLI's bundler writes one.
NAME_ARRAY = re.compile(rb'\[(?:"[a-z0-9\[\]\-]{1,40}",){1,40}"[a-z0-9\[\]\-]{1,40}"\]')


def pinned_cli_aliases() -> list[str]:
    """The pinned CLI's alias list: the array in its binary holding both opusplan and sonnet[1m]."""
    cli = spawn.find_cli({})
    found: set[tuple[str, ...]] = set()
    with cli.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = data.find(b'"opusplan"')
        while at >= 0:
            window = data[max(0, at - 600) : at + 600]
            for m in NAME_ARRAY.finditer(window):
                names = tuple(json.loads(m.group().decode()))
                if "opusplan" in names and "sonnet[1m]" in names:
                    found.add(names)
            at = data.find(b'"opusplan"', at + 1)
    assert found, f"no array holding both 'opusplan' and 'sonnet[1m]' in {cli}: the CLI changed how it lists its aliases; read them anew"
    assert len(found) == 1, f"several alias arrays in {cli}, which is the CLI's own is unclear: {sorted(found)}"
    return list(found.pop())


def test_every_alias_of_the_pinned_cli_is_accepted() -> None:
    aliases = pinned_cli_aliases()
    assert {"fable", "best", "opusplan", "sonnet[1m]"} <= set(aliases)
    tiers = spawn.parse_model_tiers(None)
    refused = []
    for alias in aliases:
        try:
            spawn.resolve_model(alias, tiers)
        except spawn.UsageError as exc:
            refused.append(f"{alias}: {exc}")
    assert not refused, "spawn.py refuses aliases the pinned CLI accepts:\n" + "\n".join(refused)


def test_every_alias_of_the_pinned_cli_has_a_price() -> None:
    # An alias priced by the fallback would estimate fable (8/40) as sonnet (3/15).
    for alias in pinned_cli_aliases():
        family = spawn.price_family(alias.removesuffix("[1m]"))
        assert family in alias or alias in spawn.ALIAS_PRICE_FAMILY, f"{alias} is priced as {family}"
    assert spawn.price_per_mtok("best") == spawn.MODEL_PRICES_USD_PER_MTOK["opus"]
    assert spawn.price_per_mtok("fable") > spawn.price_per_mtok("opus")
    assert spawn.DEFAULT_AGENT_COST_USD["fable"] > spawn.DEFAULT_AGENT_COST_USD["opus"]


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("claude-sonet-4", "claude-sonnet-4"),
        ("claude-3-5-hiaku-20241022", "claude-3-5-haiku-20241022"),
        ("sonet", "sonnet"),
        ("fabel", "fable"),
    ],
)
def test_a_misspelt_model_is_refused_with_the_name_meant(env: dict[str, str], mock_model: MockModel, typo: str, meant: str) -> None:
    proc = run_spawn(["--model", typo, "--task", "hi"], env)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("spawn: error:"), proc.stderr
    assert f"did you mean {meant!r}?" in proc.stderr, proc.stderr
    assert not mock_model.requests(), "refused before the model is asked"


@pytest.mark.parametrize(
    "model", ["claude-custom-1", "us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-opus-4-5@20251101", "claude-mythos-5"]
)
def test_model_ids_of_every_shape_are_accepted(model: str) -> None:
    assert spawn.resolve_model(model, spawn.parse_model_tiers(None)) == model


def cli_model_for(alias: str, env: Mapping[str, str], mock_model: MockModel, home: Path) -> str:
    """The model the pinned CLI asks the API for when given this alias on its own."""
    home.mkdir()
    bare = {**env, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude")}
    before = len(mock_model.requests())
    proc = subprocess.run(
        [str(spawn.find_cli({})), "-p", "bare cli", "--model", alias],
        env=bare,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    models = {str(r["model"]) for r in mock_model.requests()[before:] if r["kind"] == "main"}
    assert len(models) == 1, models
    return models.pop()


def test_an_agent_file_with_model_fable_runs_with_the_model_the_cli_would_use(
    env: dict[str, str], mock_model: MockModel, tmp_path: Path
) -> None:
    expected = cli_model_for("fable", env, mock_model, tmp_path / "bare")
    project = tmp_path / "project"
    write_agent(project, "storyteller", "description: tells stories\nmodel: fable\ntools: Read")
    before = len(mock_model.requests())
    proc = run_spawn(["--agent", "storyteller", "--task", mock_task("tell", [{"text": "once upon a time"}])], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert stdout_json(proc)["status"] == "done"
    models = {r["model"] for r in mock_model.requests()[before:] if r["kind"] == "main"}
    assert models == {expected}, f"spawn.py asked for {models}, the pinned CLI asks for {expected}"


# ------------------------------------------------ agent files Claude Code loads --

RULE = "-" * 56
AGENT_FILES = {
    # A rule of dashes closes the frontmatter for Claude Code: its first three do.
    "ruled": f"---\nname: ruled\ndescription: closed by a long rule\nmodel: haiku\n{RULE}\nYou are terse.\n",
    # A '---' inside a value closes it there: model: is prompt to Claude Code.
    "dashed": "---\nname: dashed\ndescription: reviews code --- carefully\nmodel: haiku\n---\nYou are terse.\n",
    # A model that is no string is ignored.
    "listed": "---\nname: listed\ndescription: a list for a model\nmodel: [haiku]\n---\nYou are terse.\n",
}


def cli_agent_model(name: str, env: Mapping[str, str], mock_model: MockModel, project: Path, home: Path) -> str:
    """The model the pinned CLI asks for when it runs the project's agent file NAME itself."""
    home.mkdir()
    bare = {**env, "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude")}
    before = len(mock_model.requests())
    proc = subprocess.run(
        [str(spawn.find_cli({})), "-p", f"bare cli {name}", "--agent", name],
        env=bare,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"the pinned CLI does not load {name}: {proc.stderr}"
    models = {str(r["model"]) for r in mock_model.requests()[before:] if r["kind"] == "main"}
    assert len(models) == 1, models
    return models.pop()


def spawn_model(args: list[str], env: Mapping[str, str], mock_model: MockModel, project: Path) -> str:
    before = len(mock_model.requests())
    proc = run_spawn([*args, "--task", mock_task(" ".join(args), [{"text": "ok"}])], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    models = {str(r["model"]) for r in mock_model.requests()[before:] if r["kind"] == "main"}
    assert len(models) == 1, models
    return models.pop()


@pytest.mark.parametrize("name", sorted(AGENT_FILES))
def test_an_agent_file_claude_code_loads_runs_with_the_model_claude_code_reads(
    name: str, env: dict[str, str], mock_model: MockModel, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / ".claude" / "agents").mkdir(parents=True)
    (project / ".claude" / "agents" / f"{name}.md").write_text(AGENT_FILES[name])
    haiku = cli_model_for("haiku", env, mock_model, tmp_path / "bare-haiku")
    honoured = cli_agent_model(name, env, mock_model, project, tmp_path / "bare-agent") == haiku
    ours = spawn_model(["--agent", name], env, mock_model, project)
    if honoured:
        assert ours == haiku, f"Claude Code runs {name} on haiku ({haiku}); spawn.py asked for {ours}"
    else:
        default = spawn_model([], env, mock_model, project)
        assert ours == default != haiku, f"Claude Code ignores {name}'s model; spawn.py asked for {ours}, its default is {default}"
    assert spawn.parse_definition(AGENT_FILES[name], f"{name}.md", "project")[0] is not None


# ------------------------------------------------------------- dag validate --

MISTAKES = """\
defaults:
  tools: [Read]
tasks:
  - id: first
    task: a task that would run and be paid for
  - id: review
    task: review the diff
    blockedBy: [first]
    agent: code-reviewr
  - id: shape
    task: summarise
    schema: {"type": "objekt"}
  - id: named
    task: summarise again
    schema: sumary
  - id: pick
    task: pick one
    model: sonet
  - id: count
    task: count the lines
    max_turns: many
"""


@pytest.mark.parametrize("verb", ["validate", "run"])
def test_dag_reports_every_semantic_mistake_at_its_options_line_before_anything_runs(
    verb: str, env: dict[str, str], mock_model: MockModel, session_root: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    write_agent(project, "code-reviewer", "description: reviews code")
    graph = project / "graph.yaml"
    graph.write_text(MISTAKES)
    proc = run_spawn(["dag", verb, "graph.yaml"], env, cwd=project)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    lines = proc.stderr.splitlines()
    expected = [
        ("graph.yaml:9: task 'review': no agent definition 'code-reviewr'", "did you mean 'code-reviewer'?"),
        ("graph.yaml:12: task 'shape': schema inline is not a valid JSON Schema", "did you mean 'object'?"),
        ("graph.yaml:15: task 'named': unknown schema 'sumary'", "did you mean 'summary'?"),
        ("graph.yaml:18: task 'pick': model 'sonet' is no known model", "did you mean 'sonnet'?"),
        # A value the flag parser refuses, at its option's line too (it was the task's).
        ("graph.yaml:21: task 'count': argument --max-turns: invalid int value: 'many'", ""),
    ]
    assert len(lines) == len(expected), proc.stderr
    for line, (head, hint) in zip(lines, expected, strict=True):
        assert line.startswith(f"spawn: error: {head}") and hint in line, line
    assert proc.stdout == ""
    assert not mock_model.requests(), "no task started, none paid for"
    assert not list(session_root.glob("*/agents/*")), "nothing registered"


# ---------------------------------------------------------- the Python API --


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": "30"}, "timeout='30' must be a number, not str"),
        ({"max_depth": "2"}, "max_depth='2' must be a whole number, not str"),
        ({"max_turns": 2.5}, "max_turns=2.5 must be a whole number"),
        ({"max_budget_usd": True}, "max_budget_usd=True takes a value, not True or False"),
        ({"no_wait": 1}, "no_wait=1 must be True or False"),
        ({"model": 4}, "model=4 must be a string"),
        ({"sandbox": "maybe"}, "sandbox='maybe' must be 'auto' or 'on' or 'off'"),
    ],
)
def test_the_python_api_checks_every_options_type_before_anything_starts(
    options: dict[str, object], words: str, env: dict[str, str], mock_model: MockModel, session_root: Path
) -> None:
    with pytest.raises(spawn.UsageError) as raised:
        spawn.run(mock_task("typed", [{"text": "ran"}]), env=env, **options)  # type: ignore[arg-type]
    assert words in raised.value.message
    assert raised.value.exit_code == spawn.ExitCode.USAGE
    assert not mock_model.requests()
    assert not list(session_root.glob("*/agents/*"))


def test_the_python_api_takes_every_documented_type(env: dict[str, str], tmp_path: Path) -> None:
    result = spawn.run(
        mock_task("typed", [{"text": "ran"}]),
        env=env,
        timeout=60,
        max_depth=2,
        max_budget_usd=1,
        cwd=tmp_path,
        tools=("Read",),  # type: ignore[arg-type]  # a tuple is a sequence as good as the list the type says
        schema=None,  # type: ignore[arg-type]  # None is the flag left out
    )
    assert result.ok, result.reason


# ------------------------------------------------------------- uv pip install --

INSTALL_FILES = ("spawn.py", "spawn.py.lock", "pyproject.toml", "README.md", "src/spawnlib/py.typed")


def locked_version(lock: Path, package: str) -> str:
    import tomllib

    found = [p["version"] for p in tomllib.loads(lock.read_text())["package"] if p["name"] == package]
    assert len(found) == 1, found
    return str(found[0])


def documented_install() -> list[str]:
    """The shell lines docs/python-api.md gives for installing with the lock's versions."""
    text = (ROOT / "docs" / "python-api.md").read_text()
    block = re.search(r"## Installing.*?```bash\n(.*?)```", text, re.DOTALL)
    assert block, "docs/python-api.md lost its install commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_documented_install_gets_the_locked_versions_and_writes_nothing_uninvited(base_env: dict[str, str], tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv, "uv is needed to test the documented install"
    checkout = tmp_path / "checkout"
    for name in INSTALL_FILES:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, checkout / name)
    env = without_nox(base_env)
    env["UV_CACHE_DIR"] = (
        os.environ.get("UV_CACHE_DIR") or subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    )
    for line in documented_install():
        proc = subprocess.run(line, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, f"{line}: {proc.stderr}"
    venv = checkout / ".venv"
    python = venv / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('claude-agent-sdk'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0, f"the installed venv has no claude-agent-sdk: {probe.stderr}"
    version = probe.stdout.strip()
    assert version == locked_version(ROOT / "spawn.py.lock", "claude-agent-sdk")
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )

    helped = subprocess.run([str(venv / "bin" / "spawn"), "--help"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == spawn.ExitCode.OK, helped.stderr
    assert helped.stdout.startswith("usage: spawn [-h]"), helped.stdout[:80]
    assert not (site / "_spawn_fast_start.pth").exists(), "the spawn command wrote a start-up hook into the user's own environment"
    from_source = subprocess.run(
        [str(python), str(checkout / "spawn.py"), "--version"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert from_source.returncode == spawn.ExitCode.OK, from_source.stderr
    assert not (site / "_spawn_fast_start.pth").exists(), "spawn.py wrote a start-up hook into the user's own environment"
    asked = subprocess.run(
        [str(python), str(checkout / "spawn.py"), "--version"],
        env={**env, "SPAWN_FAST_START": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert asked.returncode == spawn.ExitCode.OK, asked.stderr
    assert (site / "_spawn_fast_start.pth").exists(), "SPAWN_FAST_START=1 asks for the hook"


# ----------------------------------------------------------- small frictions --


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["--task", "x", "--schema", "sumary", "--dry-run"], "did you mean 'summary'?"),
        (["--task", "x", "--placement", "inproc", "--dry-run"], "did you mean 'inprocess'?"),
        (["budget", "some-session", "--rasie", "1"], "did you mean '--raise'?"),
    ],
)
def test_a_misspelt_value_or_flag_gets_a_did_you_mean(args: list[str], hint: str, env: dict[str, str], session_root: Path) -> None:
    proc = run_spawn(args, env)
    assert proc.returncode == spawn.ExitCode.USAGE, proc.stderr
    assert proc.stderr.startswith("spawn: error:") and hint in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


def test_agents_with_no_action_lists_them(base_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "project"
    write_agent(project, "helper", "description: helps")
    bare = run_spawn(["agents"], base_env, cwd=project)
    listed = run_spawn(["agents", "list"], base_env, cwd=project)
    assert bare.returncode == spawn.ExitCode.OK, bare.stderr
    assert bare.stdout == listed.stdout and "helper" in bare.stdout


def test_the_console_script_calls_itself_spawn(base_env: dict[str, str], tmp_path: Path) -> None:
    # What pip writes for [project.scripts] spawn = "spawn:console_main".
    script = tmp_path / "bin" / "spawn"
    script.parent.mkdir()
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom spawn import console_main\nconsole_main()\n")
    for args in (["--help"], ["status", "--help"]):
        proc = subprocess.run([sys.executable, str(script), *args], env=base_env, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == spawn.ExitCode.OK, proc.stderr
        assert proc.stdout.startswith(f"usage: spawn {args[0] + ' ' if args[0] != '--help' else ''}["), proc.stdout[:80]
    wrong = subprocess.run([sys.executable, str(script), "statsu"], env=base_env, capture_output=True, text=True, timeout=60, check=False)
    assert wrong.returncode == spawn.ExitCode.USAGE


def test_the_wait_command_background_prints_is_one_a_user_types(env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in env.items() if k != "UV_RUN_RECURSION_DEPTH"}
    started = stdout_json(run_spawn(["--background", "--task", mock_task("bg", [{"text": "back"}])], env, cwd=tmp_path))
    command = started["wait"]
    assert spawn.COMPILED_DIR not in command, command
    assert command == f"{sys.executable} {SPAWN} wait {started['id']}"
    waited = subprocess.run(shlex.split(command), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert waited.returncode == spawn.ExitCode.OK, waited.stderr
    assert stdout_json(waited)["agents"][0]["output"] == "back"


def test_the_wait_command_says_uv_run_under_uv_and_spawn_for_the_console_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spawn.user_command({"UV_RUN_RECURSION_DEPTH": "1"}, spawn.SCRIPT_PATH.parent) == "uv run spawn.py"
    assert spawn.user_command({}, tmp_path) == f"{sys.executable} {spawn.SCRIPT_PATH}"
    patch_name(monkeypatch, "PROGRAM_NAME", "spawn")
    assert spawn.user_command({}, tmp_path) == "spawn"
