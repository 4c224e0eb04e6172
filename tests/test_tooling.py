"""Quiet, hermetic, honest tooling: the script's settings, the tests' own hygiene, --help."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, SPAWN, MockModel, run_python, run_spawn, spawn_in_bash

import spawn


def script_block(path: Path) -> str:
    """The PEP 723 block of a script, without the comment markers."""
    text = path.read_text()
    block = re.search(r"^# /// script\n(.*?)^# ///$", text, re.MULTILINE | re.DOTALL)
    assert block is not None, path
    return "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.group(1).splitlines())


def test_no_bytecode_compile_setting_that_prints_on_every_run() -> None:
    assert "compile-bytecode" not in script_block(SPAWN)


def test_soak_declares_what_it_imports() -> None:
    block = script_block(ROOT / "tools" / "soak.py")
    assert "jsonschema" in block and "psutil" in block


def test_tests_are_type_checked() -> None:
    assert '"tests"' in (ROOT / "noxfile.py").read_text().split("def typecheck", 1)[1].split("@nox.session", 1)[0]


def spawn_importers() -> list[Path]:
    """The files that may import spawn as a module: the tests and the dev tools."""
    tools = [ROOT / "tools" / f"{name}.py" for name in ("bench", "bench_cost", "soak", "demo")]
    return sorted((ROOT / "tests").glob("*.py")) + tools + sorted((ROOT / "tools" / "benchlib").glob("*.py"))


def test_import_spawn_in_the_tests_is_the_source_under_src() -> None:
    """The file a unit test tests is the file a maintainer edits: the functions behind `spawn`
    are src/spawnlib's own (end-to-end tests run the spawn.py generated from them)."""
    package = ROOT / "src" / "spawnlib"
    for function in (spawn.main, spawn.decide, spawn.commit_outcome, spawn.forkserver_stand_in):
        assert Path(function.__code__.co_filename).resolve().is_relative_to(package), function
    assert not hasattr(spawn, "__file__")  # no file is "spawn": a test that needs the script names SPAWN
    assert SPAWN.resolve() == spawn.SCRIPT_PATH  # what the package's children run: the generated file


def test_only_conftest_imports_the_package_by_its_name() -> None:
    """Tests and dev tools say `import spawn`: one namespace, as users import it."""
    pattern = re.compile(r"^\s*(from|import)\s+spawnlib\b", re.MULTILINE)
    importers = [p.name for p in spawn_importers() if p.name != "conftest.py" and pattern.search(p.read_text())]
    assert importers == []


def test_tests_and_dev_tools_use_only_spawns_public_names() -> None:
    """A private name is free to change; one a test needs is made public in the package instead."""
    private = re.compile(r"\bspawn\._[A-Za-z]\w*|^\s*from\s+spawn\s+import\s+.*\b_[A-Za-z]\w*", re.MULTILINE)
    uses = [f"{p.name}: {m.group(0).strip()}" for p in spawn_importers() for m in private.finditer(p.read_text())]
    assert uses == []


def test_spawn_in_bash_quotes_each_argument() -> None:
    assert spawn_in_bash("--task", "it's a task") == '"$SPAWN_PYTHON" "$SPAWN_PY" --task \'it\'"\'"\'s a task\''


def test_no_spawn_variable_leaks_into_the_tests() -> None:
    leaked = [n for n in os.environ if n.startswith("SPAWN_") or n == "TRACEPARENT"]
    assert leaked == []


def test_tests_pass_when_run_from_inside_an_agent(tmp_path: Path) -> None:
    agent_env = {**os.environ, "SPAWN_DEPTH": "3", "SPAWN_MAX_DEPTH": "3", "SPAWN_DEADLINE": "1", "TRACEPARENT": "junk"}
    test = f"{__file__}::test_no_spawn_variable_leaks_into_the_tests"
    proc = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", test], agent_env, cwd=ROOT)
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout[-2000:]


def test_help_lists_every_verb_and_traceback(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--help"], base_env)
    assert proc.returncode == spawn.ExitCode.OK
    text = " ".join(proc.stdout.split())
    for verb in ("wait", "status", "kill", "reap", "approve", "deny", "agents"):
        assert re.search(rf"\b{verb}\b", text.split("Verbs:", 1)[1]), verb
    assert "--traceback" in text
    verb_help = run_spawn(["status", "--help"], base_env)
    assert "--traceback" in verb_help.stdout


def test_mock_model_ignores_a_client_that_hangs_up(mock_model: MockModel) -> None:
    url = urllib.parse.urlparse(mock_model.url)
    assert url.hostname is not None and url.port is not None
    body = json.dumps({"model": "m", "max_tokens": 10, "tools": [{"name": "Bash"}], "messages": [{"role": "user", "content": "hi"}]})
    request = f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST, like a killed CLI
        sock.sendall(request.encode())
    # A whole request on a new connection: served after the hung-up one was handled.
    ok = urllib.request.Request(mock_model.url + "/v1/messages", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(ok, timeout=10) as resp:
        assert resp.status == 200
    mock_model.stop()
    err = mock_model.stderr_log.read_text()
    assert "Traceback" not in err, err[-2000:]


def test_print_id_needs_no_jq(base_env: dict[str, str]) -> None:
    proc = run_spawn(["--task", "x", "--dry-run", "--print", "id"], base_env)
    assert proc.returncode == spawn.ExitCode.OK, proc.stderr
    assert proc.stdout == "(assigned at registration)\n"
    assert "--print id" in (ROOT / "README.md").read_text() and "jq -r" not in (ROOT / "README.md").read_text()


def test_docs_document_stale_runner_log_and_credential() -> None:
    cli, sessions, environment = ((ROOT / "docs" / page).read_text() for page in ("cli.md", "sessions.md", "environment.md"))
    assert '"stale"' in cli and "runner.log" in sessions and "*CREDENTIAL*" in environment
    agents = (ROOT / "docs" / "agents.md").read_text()
    assert "model: sonnet" in agents and "model: sonnet" in spawn.AGENT_TEMPLATE


def test_demo_honours_the_session_root_variable() -> None:
    assert 'os.environ.get("SPAWN_SESSION_ROOT")' in (ROOT / "tools" / "demo.py").read_text()


def import_bench() -> Any:
    """The bench's shared pieces (tools/benchlib/core.py: targets, checks of a run)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from benchlib import core
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return core


def test_bench_a_row_only_reported_is_never_a_miss() -> None:
    """P6 without the fork server is reported beside the target, not held to it: --check must not fail on it."""
    bench = import_bench()
    reported = bench.Target("Python side, SPAWN_NO_FORKSERVER=1", 0.2, float("inf"), "x", "P6")
    held = bench.Target("Python side, with fork server", 0.2, bench.TARGET_MEMORY_RATIO, "x", "P6")
    assert reported.met and not reported.has_limit and reported.limit_text() == "(reported)"
    assert not held.met and held.limit_text() == "<= 0.15x"


def test_bench_compare_row_is_the_ratio_of_medians_held_to_five_percent() -> None:
    """Unit test of compare_target: issue 32's old-against-new row, from (this, --compare) times of interleaved rounds."""
    bench = import_bench()
    within = bench.compare_target("P1", "depth-3 chain", [(4.2, 4.0), (4.0, 4.1), (4.1, 4.0)], "")
    assert within.value == pytest.approx(4.1 / 4.0) and within.met and within.limit_text() == "<= 1.05x"
    assert "(4.100 s vs 4.000 s; rounds 1.05x, 0.98x, 1.02x)" in within.name
    slower = bench.compare_target("P1b", "16 background leaves + wait --all", [(11.0, 10.0)], "")
    assert not slower.met
    skipped = bench.compare_target("P1b", "fan-out", [], "")
    assert not skipped.measured and skipped.met


def test_bench_cost_prices_cache_reads_and_writes_and_counts_leaves_reading_the_head() -> None:
    """P8's arithmetic: reads at a tenth of the input price, writes at 1.25 (2 for an hour);
    a leaf reads the head when its first request read at least that much."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bench_cost as cost
    finally:
        sys.path.remove(str(ROOT / "tools"))
    price = spawn.price_per_mtok("sonnet")[0]
    million = 1_000_000
    assert cost.input_usd("sonnet", {"input_tokens": million, "output_tokens": million}) == pytest.approx(price)
    assert cost.input_usd("sonnet", {"cache_read_input_tokens": million}) == pytest.approx(price * spawn.CACHE_READ_FACTOR)
    assert cost.input_usd("sonnet", {"cache_creation_input_tokens": million}) == pytest.approx(price * spawn.CACHE_WRITE_FACTOR)
    hour = {"cache_creation_input_tokens": million, "cache_creation": {"ephemeral_1h_input_tokens": million}}
    assert cost.input_usd("sonnet", hour) == pytest.approx(price * 2)
    reader = cost.Agent("a1-r", 1, [("sonnet", {"cache_read_input_tokens": 900, "input_tokens": 10})], head_tokens=900)
    writer = cost.Agent("a1-w", 1, [("sonnet", {"cache_creation_input_tokens": 900, "input_tokens": 10})], head_tokens=900)
    root = cost.Agent("a0-x", 0, [("sonnet", {"input_tokens": 100}), ("sonnet", {"cache_read_input_tokens": 100})], head_tokens=500)
    tree = cost.tree_cost("fan-out", "", [root, reader, writer], leaf_depth=1)
    assert (tree.agents, tree.leaves, tree.leaves_reading_head) == (3, 2, 1)
    assert tree.tokens == {"input": 120, "cache read": 1000, "cache write": 900}
    first = cost.input_usd("sonnet", {"input_tokens": 100 + 10 + 10, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 900})
    assert tree.first_input_usd == pytest.approx(first)
    assert tree.input_usd == pytest.approx(first + cost.input_usd("sonnet", {"cache_read_input_tokens": 100}))


def test_bench_counts_a_clis_retry_as_the_same_turn_and_names_an_agent_run_twice() -> None:
    bench = import_bench()
    step = {"task_digest": "d1", "step_index": 0, "status": 200}
    root = [{"task_digest": "r", "step_index": i, "status": 200, "session": "r", "retry": 0} for i in (0, 1)]
    bench.check_turns("fan-out", [*root, {**step, "session": "s1", "retry": 0}, {**step, "session": "s1", "retry": 1}], 3)
    with pytest.raises(bench.BenchError, match=r"4 model turns \(0 retries besides\), expected 3; .*d1 step 0 by s1/retry 0, s2/retry 0"):
        bench.check_turns("fan-out", [*root, {**step, "session": "s1", "retry": 0}, {**step, "session": "s2", "retry": 0}], 3)


def test_the_mutant_list_matches_the_source_and_only_listed_survivors_count_as_equivalent() -> None:
    """tools/mutants.toml: every hand-written mutant's text is in today's source once, every
    [[equivalent]] names a line its file could hold, and a survivor it doesn't list stays a survivor."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mutants
    finally:
        sys.path.remove(str(ROOT / "tools"))
    data = mutants.load_list()
    assert len(mutants.hand_mutants(data)) >= 12  # raises MutantListError if one has moved
    for entry in data["equivalent"]:
        assert (ROOT / entry["file"]).is_file() and entry["why"], entry
    listed = data["equivalent"][0]

    def survivor(file: str, detail: str) -> mutants.Result:
        m = mutants.Mutant("x", file, 1, (), False, "")
        return mutants.Result(m, "survived", 1.0, detail)

    judged = mutants.judged_equivalent([survivor(listed["file"], listed["line"]), survivor(listed["file"], "x = 1")], data)
    assert [r.verdict for r in judged] == ["equivalent", "survived"]
    assert listed["why"] in judged[0].detail
