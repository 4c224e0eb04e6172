"""The GitHub Actions example (docs/examples/github-actions.yml), run step by step.

Its `run:` steps run in order, each in bash as GitHub's runner runs one
(`bash --noprofile --norc -eo pipefail`), in a workspace that holds this
checkout's files, with the job's `env:`, GITHUB_ENV carried from step to step,
and `if: always()` honoured. They drive the real CLI through the real spawn.py
against the scripted model, as the workflow does when no ANTHROPIC_API_KEY secret
is set. Steps that only set up the runner (checkout, uv) are skipped with a
stated reason; the upload step is not run, but the paths it names are checked.
Anything else the harness doesn't know (an action, an expression, a condition)
fails the test rather than being skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import ROOT, load

import spawn

EXAMPLE = ROOT / "docs" / "examples" / "github-actions.yml"
SCENARIO = ROOT / "docs" / "examples" / "ci-scenario.json"
# Actions that only prepare the runner, and why running the steps here needs neither.
SETUP_ONLY = {
    "actions/checkout": "the workspace is a copy of this checkout's files",
    "astral-sh/setup-uv": "uv is on PATH here (.ci/run installs it on a fresh machine)",
}
UPLOAD = "actions/upload-artifact"
# What the steps need of the repository: the script, its lock, the tools, the examples.
CHECKOUT = ["spawn.py", "spawn.py.lock", "schemas", "tools", "docs", "README.md"]
STEP_TIMEOUT_S = 600
SVG_NS = "{http://www.w3.org/2000/svg}"


class ExampleError(Exception):
    """The workflow uses something this harness cannot run faithfully."""


@dataclass
class Step:
    name: str
    skipped: str | None = None  # why it did not run
    returncode: int | None = None
    output: str = ""
    upload_paths: list[str] = field(default_factory=list)


def load_job(path: Path) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    jobs = workflow["jobs"]
    assert len(jobs) == 1, "the example has one job"
    job = next(iter(jobs.values()))
    assert isinstance(job, dict)
    return job


def expand(text: str, context: Mapping[str, str]) -> str:
    """`${{ expr }}` replaced from context; an expression it doesn't know is an error, not a blank."""

    def value(m: re.Match[str]) -> str:
        expr = m[1].strip()
        if expr not in context:
            raise ExampleError(f"unknown expression ${{{{ {expr} }}}}")
        return context[expr]

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def read_github_env(path: Path) -> dict[str, str]:
    """GITHUB_ENV's lines: NAME=VALUE, or NAME<<DELIMITER ... DELIMITER for several lines."""
    values: dict[str, str] = {}
    lines = iter(path.read_text().splitlines()) if path.exists() else iter([])
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            body: list[str] = []
            for more in lines:
                if more == delimiter:
                    break
                body.append(more)
            else:
                raise ExampleError(f"GITHUB_ENV: {name} has no closing {delimiter}")
            values[name] = "\n".join(body)
        elif line.strip():
            name, _, val = line.partition("=")
            values[name] = val
    return values


@dataclass
class Runner:
    """One job's steps, run in order in `workspace` with GitHub's step semantics."""

    workspace: Path
    temp: Path
    base_env: dict[str, str]
    groups: list[int] = field(default_factory=list)  # process groups of the steps, ended at teardown

    def context(self) -> dict[str, str]:
        # The repository's secrets are absent: the scripted model answers.
        return {"github.workspace": str(self.workspace), "runner.temp": str(self.temp), "secrets.ANTHROPIC_API_KEY": ""}

    def run(self, job: Mapping[str, Any]) -> list[Step]:
        files = {name: self.temp / name for name in ("github_env", "github_path", "github_output", "step_summary")}
        env = {
            **self.base_env,
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(self.workspace),
            "RUNNER_TEMP": str(self.temp),
            "GITHUB_ENV": str(files["github_env"]),
            "GITHUB_PATH": str(files["github_path"]),
            "GITHUB_OUTPUT": str(files["github_output"]),
            "GITHUB_STEP_SUMMARY": str(files["step_summary"]),
        }
        env.update({k: expand(str(v), self.context()) for k, v in job.get("env", {}).items()})
        steps: list[Step] = []
        failed = False
        for number, raw in enumerate(job["steps"]):
            step = Step(raw.get("name") or raw.get("uses") or f"step {number}")
            steps.append(step)
            condition = raw.get("if")
            if condition not in (None, "always()"):
                raise ExampleError(f"{step.name}: condition {condition!r} is not one this harness evaluates")
            if failed and condition != "always()":
                step.skipped = "an earlier step failed (GitHub skips it too)"
                continue
            if "uses" in raw:
                action = str(raw["uses"]).split("@", 1)[0]
                if action in SETUP_ONLY:
                    step.skipped = SETUP_ONLY[action]
                elif action == UPLOAD:
                    step.skipped = "uploading is GitHub's; the paths it names are checked instead"
                    step.upload_paths = [p.strip() for p in expand(raw["with"]["path"], self.context()).splitlines() if p.strip()]
                else:
                    raise ExampleError(f"{step.name}: action {action} is neither set-up nor upload; the harness can't run it")
                continue
            script = self.temp / f"step-{number}.sh"
            script.write_text(expand(raw["run"], self.context()))
            step_env = {**env, **read_github_env(files["github_env"])}
            if files["github_path"].exists():
                extra = [line for line in files["github_path"].read_text().splitlines() if line.strip()]
                step_env["PATH"] = os.pathsep.join([*reversed(extra), step_env["PATH"]])
            proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                cwd=self.workspace,
                env=step_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its group holds what it leaves running (the scripted model)
            )
            self.groups.append(proc.pid)
            step.output, _ = proc.communicate(timeout=STEP_TIMEOUT_S)
            step.returncode = proc.returncode
            failed = failed or proc.returncode != 0
        return steps

    def end(self) -> None:
        """SIGTERM to each step's group, then SIGKILL to what is left: a `uv run` pair was seen outliving SIGTERM."""
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):  # it ended with its step
                os.killpg(group, signal.SIGTERM)
        limit = time.monotonic() + 5
        while self.groups and time.monotonic() < limit and any(group_alive(g) for g in self.groups):
            time.sleep(0.1)
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def by_name(steps: list[Step]) -> dict[str, Step]:
    return {s.name: s for s in steps}


def assert_all_ran_and_passed(steps: list[Step]) -> None:
    """Every run step ran and exited 0; only the set-up and upload steps were skipped, each with its reason."""
    for step in steps:
        if step.skipped is not None:
            assert step.skipped in (*SETUP_ONLY.values(), "uploading is GitHub's; the paths it names are checked instead"), (
                f"{step.name} was skipped: {step.skipped}"
            )
        else:
            assert step.returncode == 0, f"step {step.name!r} exited {step.returncode}:\n{step.output[-3000:]}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """What actions/checkout would leave: this checkout's files (none of its sessions or caches)."""
    ws = tmp_path / "workspace"
    ws.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in CHECKOUT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, ws / name, ignore=ignore)
        else:
            shutil.copy2(source, ws / name)
    return ws


@pytest.fixture
def runner(tmp_path: Path, workspace: Path, base_env: dict[str, str]) -> Iterator[Runner]:
    if shutil.which("uv", path=base_env["PATH"]) is None:
        pytest.fail("uv is not on PATH: the example runs every command through uv (.ci/run installs it)")
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    env = {
        **base_env,
        # Packages and uv's own Pythons come from under the real HOME, not the test's private one.
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv"),
        "UV_PYTHON_INSTALL_DIR": os.environ.get("UV_PYTHON_INSTALL_DIR") or str(Path.home() / ".local" / "share" / "uv" / "python"),
    }
    env.pop("SPAWN_SESSION_ROOT")  # the job's env sets it
    run = Runner(workspace, temp, env)
    yield run
    run.end()


def test_the_example_runs_a_tree_and_keeps_its_timeline(runner: Runner, workspace: Path) -> None:
    steps = runner.run(load_job(EXAMPLE))
    for step in steps:  # `pytest -s` shows what ran and what was skipped, and why
        print(f"{step.name}: {'skipped: ' + step.skipped if step.skipped else f'exit {step.returncode}'}")
    assert_all_ran_and_passed(steps)
    named = by_name(steps)
    assert named["Start the scripted model (only without ANTHROPIC_API_KEY)"].returncode == spawn.ExitCode.OK
    assert named["Run the tree"].returncode == spawn.ExitCode.OK
    assert "the tree is done" in named["Run the tree"].output
    assert "3 of 3 agents done" in named["Check that every agent of the tree is done"].output

    # The tree ran against the scripted model, in the session root the job names.
    requests = [json.loads(line) for line in (runner.temp / "mock-requests.jsonl").read_text().splitlines()]
    assert requests, "the scripted model answered nothing"
    (session,) = (workspace / "spawn-sessions").iterdir()
    outcomes = {d.name: load(d / "outcome.json") for d in (session / "agents").iterdir()}
    metas = {d.name: load(d / "meta.json") for d in (session / "agents").iterdir()}
    assert sorted(m["depth"] for m in metas.values()) == [0, 1, 1]
    assert {o["status"] for o in outcomes.values()} == {"done"}
    assert all((session / "agents" / name / ".done").exists() for name in outcomes)
    review = json.loads((runner.temp / "review.json").read_text())
    jsonschema.validate(review, json.loads((ROOT / "schemas" / "summary.json").read_text()))

    # The upload step keeps a valid SVG timeline of every agent, the page, and the session.
    upload = next(s for s in steps if s.upload_paths)
    assert upload.upload_paths == ["timeline.svg", "timeline.html", "spawn-sessions/"]
    upload_with = next(raw["with"] for raw in load_job(EXAMPLE)["steps"] if str(raw.get("uses", "")).startswith(UPLOAD))
    assert upload_with.get("include-hidden-files") is True, "without it the artifact loses the .done and .fail markers"
    for path in upload.upload_paths:
        assert (workspace / path).exists(), f"the upload step names {path}, which no step wrote"
    svg_text = (workspace / "timeline.svg").read_text()
    svg = ET.fromstring(svg_text)
    assert svg.tag == f"{SVG_NS}svg"
    assert svg.findall(f".//{SVG_NS}rect"), "a timeline with no bars"
    for agent_id in outcomes:
        assert agent_id in svg_text, f"agent {agent_id} is missing from the timeline"


def test_a_broken_step_fails_and_the_timeline_is_still_kept(runner: Runner, workspace: Path) -> None:
    """The root answers text instead of its schema's object: the tree step must fail with spawn.py's
    exit code, the check after it must not run, and the timeline steps (if: always()) still must."""
    scenario = json.loads(SCENARIO.read_text())
    scenario["rules"][0]["steps"] = [{"text": "no structured answer"}]
    (workspace / "docs" / "examples" / "ci-scenario.json").write_text(json.dumps(scenario))
    steps = runner.run(load_job(EXAMPLE))
    with pytest.raises(AssertionError, match="Run the tree"):
        assert_all_ran_and_passed(steps)
    named = by_name(steps)
    assert named["Run the tree"].returncode == spawn.ExitCode.AGENT_FAILED
    assert "::error::an agent failed" in named["Run the tree"].output
    assert named["Check that every agent of the tree is done"].skipped == "an earlier step failed (GitHub skips it too)"
    assert named["Draw the timeline"].returncode == spawn.ExitCode.OK
    assert ET.fromstring((workspace / "timeline.svg").read_text()).tag == f"{SVG_NS}svg"


def test_the_harness_refuses_what_it_cannot_run(runner: Runner) -> None:
    """An unknown action, expression or condition fails the test; it is never silently skipped."""
    unknown_action = {"steps": [{"uses": "some/deploy@v1"}]}
    with pytest.raises(ExampleError, match="some/deploy"):
        runner.run(unknown_action)
    with pytest.raises(ExampleError, match=r"secrets\.OTHER"):
        runner.run({"steps": [{"run": "echo ${{ secrets.OTHER }}"}]})
    with pytest.raises(ExampleError, match="failure"):
        runner.run({"steps": [{"run": "true", "if": "failure()"}]})


def test_github_env_lines_carry_to_later_steps(runner: Runner) -> None:
    job = {
        "env": {"FROM_JOB": "job"},
        "steps": [
            {"name": "set", "run": 'echo "ONE=1" >> "$GITHUB_ENV"; printf "MANY<<EOF\\na\\nb\\nEOF\\n" >> "$GITHUB_ENV"'},
            {
                "name": "fail",
                "run": 'test "$ONE" = 1 && test "$MANY" = "$(printf "a\\nb")" && test "$FROM_JOB" = job && echo carried; exit 3',
            },
            {"name": "skipped", "run": "true"},
            {"name": "always", "run": "true", "if": "always()"},
        ],
    }
    named = by_name(runner.run(job))
    assert named["set"].returncode == 0 and named["fail"].returncode == 3 and "carried" in named["fail"].output, named["fail"].output
    assert named["skipped"].skipped is not None and named["always"].returncode == 0
