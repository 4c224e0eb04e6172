#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = ["cosmic-ray==8.7.0"]
#
# [tool.uv]
# exclude-newer = "2026-11-20T00:00:00Z"
# ///
"""Mutation testing on the guarantees: `uvx nox -s mutants` (issue 47, item 6).

Two sets of mutants, both listed in tools/mutants.toml:

- hand-written ([[mutant]]): one guarantee each (the ledger's lock, the
  session's flock, the depth checks, the budget pause, the deny loop, the
  commit order, the broker's subtree check), as the exact text to replace in
  a file of src/, the tests that must notice, and why it matters;
- generated ([[target]]): cosmic-ray's operators over the named functions of
  those modules, capped (--cap) by an even, deterministic pick.

A mutant is never applied to this checkout (others run tests from it): each
job copies the project (git's files, as they are in the work tree) into a
temp dir, mutates the copy's source, and runs the mutant's tests there. The
tests import src/ and regenerate the copy's spawn.py before they start, so
the end-to-end tests run the mutant too. Killed: the tests fail. Before any
mutant, each distinct test selection runs once on the unmutated copy; if it
fails there, its mutants are `baseline-red`, not killed.

    python3 tools/mutants.py                # both sets
    python3 tools/mutants.py --hand         # only the hand-written set
    python3 tools/mutants.py ledger-lock-off deny-loop-removed   # these, by name
    python3 tools/mutants.py --list         # what would run, without running it
    python3 tools/mutants.py --jobs 2 --cap 60

Exit 1 if a hand-written mutant survives, times out or meets a red baseline
(each guarantee has a test that breaks without it); the generated set is
reported, not enforced.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import dataclasses
import difflib
import importlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tools" / "mutants.toml"
DEFAULT_CAP = 150  # the generated set's size: the "about 150", each a pytest run of its selection
# A run that takes this many times its baseline (plus the slack) is stuck, not slow.
TIMEOUT_FACTOR, TIMEOUT_SLACK_S = 3.0, 60.0


class MutantListError(Exception):
    """tools/mutants.toml does not match the source: a mutant must be re-pointed."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    """Relative to the project root, as in the copy."""
    line: int
    """Where the change starts in the unmutated file (for the report)."""
    tests: tuple[str, ...]
    """Test files or node ids, run from the copy's root."""
    hand: bool
    why: str
    old: str = ""
    new: str = ""
    """Hand-written: the exact text of file to replace, and what replaces it."""
    operator: str = ""
    occurrence: int = -1
    """Generated: cosmic-ray's operator and the occurrence of it in the file."""


@dataclasses.dataclass
class Result:
    mutant: Mutant
    verdict: str
    """killed, survived, timeout, baseline-red, equivalent (the same AST, or a survivor [[equivalent]] explains), or invalid."""
    seconds: float = 0.0
    detail: str = ""


def load_list(path: Path = LIST) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def hand_mutants(data: dict[str, Any]) -> list[Mutant]:
    """The [[mutant]] entries, each checked against today's source: its old text occurs exactly once."""
    found = []
    for raw in data.get("mutant", []):
        file, old = raw["file"], raw["old"]
        text = (ROOT / file).read_text(encoding="utf-8")
        count = text.count(old)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times (make it unique)"
            raise MutantListError(f"mutant {raw['name']}: old text {where} in {file}: {old!r}")
        line = text[: text.index(old)].count("\n") + 1
        check_tests(raw["name"], raw["tests"])
        found.append(Mutant(raw["name"], file, line, tuple(raw["tests"]), True, raw["why"], old=old, new=raw["new"]))
    names = [m.name for m in found]
    if len(set(names)) != len(names):
        raise MutantListError("two hand-written mutants share a name")
    return found


def check_tests(name: str, tests: Sequence[str]) -> None:
    for test in tests:
        if not (ROOT / test.split("::")[0]).is_file():
            raise MutantListError(f"mutant {name}: no test file {test.split('::')[0]}")


def function_spans(source: str, names: Sequence[str], file: str) -> dict[str, tuple[int, int]]:
    """First and last line of each named function's body (Class.method for a method).

    The body only: the signature's operators are annotations, which `from
    __future__ import annotations` never evaluates (every mutant there is equivalent).
    """
    spans: dict[str, tuple[int, int]] = {}

    def visit(body: Sequence[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                spans[prefix + node.name] = (node.body[0].lineno, node.end_lineno or node.lineno)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    if missing := [n for n in names if n not in spans]:
        raise MutantListError(f"target {file}: no function {', '.join(missing)} (re-point tools/mutants.toml)")
    return {n: spans[n] for n in names}


def generated_mutants(data: dict[str, Any], cap: int) -> list[Mutant]:
    """cosmic-ray's mutation sites within the targets' functions, at most cap of them, evenly picked."""
    plugins = importlib.import_module("cosmic_ray.plugins")
    cr_ast = importlib.import_module("cosmic_ray.ast")
    skipped = tuple(data.get("skip_operators", []))
    sites: list[Mutant] = []
    for target in data.get("target", []):
        file = target["file"]
        source = (ROOT / file).read_text(encoding="utf-8")
        spans = function_spans(source, target["functions"], file)
        check_tests(file, target["tests"])
        tree = cr_ast.get_ast(source)
        for operator in sorted(plugins.operator_names()):
            if plugins.get_operator(operator).arguments() or operator.startswith(skipped):
                continue  # parameterized operators need a configuration; the plain ones suffice here
            instance = plugins.get_operator(operator)()
            positions = [start for node in cr_ast.ast_nodes(tree) for start, _end in instance.mutation_positions(node)]
            for occurrence, (line, _col) in enumerate(positions):
                function = next((n for n, (a, b) in spans.items() if a <= line <= b), None)
                if function is not None:
                    name = f"{Path(file).stem}.{function}:{line}:{operator.split('/')[-1]}#{occurrence}"
                    sites.append(
                        Mutant(name, file, line, tuple(target["tests"]), False, function, operator=operator, occurrence=occurrence)
                    )
    sites.sort(key=lambda m: (m.file, m.line, m.operator, m.occurrence))
    if len(sites) <= cap:
        return sites
    return [sites[i * len(sites) // cap] for i in range(cap)]  # spread over every function, the same pick every run


def mutated_source(mutant: Mutant, source: str) -> str | None:
    """The file's text with the mutant applied, or None if it no longer applies."""
    if mutant.hand:
        return source.replace(mutant.old, mutant.new, 1) if source.count(mutant.old) == 1 else None
    operator = importlib.import_module("cosmic_ray.plugins").get_operator(mutant.operator)()
    mutated: str | None = importlib.import_module("cosmic_ray.mutating").mutate_code(source, operator, mutant.occurrence)
    return mutated


def changed_line(before: str, after: str) -> str:
    """The mutant's first changed line, as it reads after the change (for the report)."""
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()[:120]
    return ""


def same_ast(before: str, after: str) -> bool | None:
    """Whether the two sources parse alike (an equivalent mutant); None if after does not parse."""
    try:
        return ast.dump(ast.parse(before)) == ast.dump(ast.parse(after))
    except SyntaxError:
        return None


def project_files() -> list[str]:
    """The project's files as git knows them (tracked, and new ones not ignored), as they are in the work tree."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    return sorted(name for name in out.stdout.decode().split("\0") if name and (ROOT / name).is_file())


def make_copy(dest: Path, files: Sequence[str]) -> None:
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


def test_env() -> dict[str, str]:
    # No bytecode: a mutant of the same size written within the second of the
    # original would otherwise run the original's cached .pyc.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPAWN_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_tests(python: str, copy: Path, tests: Sequence[str], timeout: float, log: Path) -> tuple[str, float]:
    """(passed|failed|timeout|no-tests, seconds) of the tests run in copy."""
    argv = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=300", *tests]
    start = time.monotonic()
    with log.open("wb") as out:
        # A session of its own, so a timeout ends the tests' whole process group.
        proc = subprocess.Popen(argv, cwd=copy, env=test_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout", time.monotonic() - start
    seconds = time.monotonic() - start
    return {0: "passed", 5: "no-tests"}.get(code, "failed"), seconds


class Copies:
    """One project copy per job, each lent to one run at a time."""

    def __init__(self, work: Path, jobs: int) -> None:
        files = project_files()
        self.free: queue.Queue[Path] = queue.Queue()
        for i in range(jobs):
            copy = work / f"copy{i}"
            make_copy(copy, files)
            self.free.put(copy)

    @contextlib.contextmanager
    def lend(self) -> Iterator[Path]:
        copy = self.free.get()
        try:
            yield copy
        finally:
            self.free.put(copy)


def run_baseline(copies: Copies, python: str, tests: tuple[str, ...], logs: Path) -> tuple[str, float]:
    with copies.lend() as copy:
        return run_tests(python, copy, tests, 3600, logs / f"baseline-{abs(hash(tests)):x}.log")


def run_mutant(copies: Copies, python: str, mutant: Mutant, baseline: tuple[str, float], logs: Path) -> Result:
    original = (ROOT / mutant.file).read_text(encoding="utf-8")
    mutated = mutated_source(mutant, original)
    if mutated is None:
        return Result(mutant, "invalid", detail="does not apply")
    detail = changed_line(original, mutated)
    if same_ast(original, mutated):
        return Result(mutant, "equivalent", detail=f"{detail} (the same AST)")
    if baseline[0] != "passed":
        return Result(mutant, "baseline-red", detail=f"its tests are {baseline[0]} unmutated")
    with copies.lend() as copy:
        target = copy / mutant.file
        target.write_text(mutated, encoding="utf-8")
        try:
            timeout = baseline[1] * TIMEOUT_FACTOR + TIMEOUT_SLACK_S
            log = logs / f"{mutant.name.replace('/', '_')}.log"
            outcome, seconds = run_tests(python, copy, mutant.tests, timeout, log)
        finally:
            target.write_text(original, encoding="utf-8")
    verdict = {"failed": "killed", "passed": "survived"}.get(outcome, outcome)
    return Result(mutant, verdict, seconds, detail)


def run_all(mutants: Sequence[Mutant], python: str, jobs: int) -> list[Result]:
    """Baselines first (one per distinct test selection), then the mutants, jobs at a time."""
    logs = Path(tempfile.mkdtemp(prefix="spawn-mutants-logs-"))  # kept: a survivor's test output
    print(f"test output of each run: {logs}", flush=True)
    with tempfile.TemporaryDirectory(prefix="spawn-mutants-") as tmp:
        copies = Copies(Path(tmp), jobs)
        selections = sorted({m.tests for m in mutants})
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            baselines = dict(zip(selections, pool.map(lambda t: run_baseline(copies, python, t, logs), selections), strict=True))
            for tests, (state, seconds) in baselines.items():
                print(f"baseline {state:8} {seconds:6.1f}s  {' '.join(tests)}", flush=True)
            futures = [pool.submit(run_mutant, copies, python, m, baselines[m.tests], logs) for m in mutants]
            results = []
            for future in futures:
                result = future.result()
                results.append(result)
                m = result.mutant
                print(f"{result.verdict:12} {result.seconds:6.1f}s  {m.name}  {m.file}:{m.line}  {result.detail}", flush=True)
    return results


def report(results: Sequence[Result]) -> list[str]:
    """The closing report: per set, counts, the killed fraction and the survivors at file:line."""
    lines = []
    for hand, title in ((True, "hand-written"), (False, "generated")):
        part = [r for r in results if r.mutant.hand == hand]
        if not part:
            continue
        counts = {v: sum(r.verdict == v for r in part) for v in ("killed", "survived", "timeout", "baseline-red", "equivalent", "invalid")}
        scored = counts["killed"] + counts["survived"] + counts["timeout"]
        fraction = f"{counts['killed']}/{scored} killed ({100 * counts['killed'] / scored:.0f}%)" if scored else "none scored"
        lines.append(f"{title}: {len(part)} mutants; {fraction}; " + ", ".join(f"{v} {n}" for v, n in counts.items() if n))
        for r in part:
            if r.verdict in ("survived", "timeout", "baseline-red") or (r.verdict == "equivalent" and not r.mutant.hand):
                lines.append(f"  {r.verdict}: {r.mutant.file}:{r.mutant.line}  {r.mutant.name}  {r.detail}")
    return lines


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mutants", description="Mutation testing on spawn.py's guarantees (tools/mutants.toml).")
    parser.add_argument("names", nargs="*", help="run only these mutants (hand-written names, or generated names' prefixes)")
    parser.add_argument("--hand", action="store_true", help="only the hand-written set")
    parser.add_argument("--generated", action="store_true", help="only the generated set")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in a copy of its own (default 1)")
    parser.add_argument("--cap", type=int, default=DEFAULT_CAP, help=f"at most this many generated mutants (default {DEFAULT_CAP})")
    parser.add_argument("--python", default="", help="the interpreter that runs the tests (default: this one)")
    parser.add_argument("--list", action="store_true", help="print the mutants that would run, and run none")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.cap < 0:
        parser.error("--jobs must be at least 1 and --cap at least 0")
    return args


def chosen(args: argparse.Namespace) -> list[Mutant]:
    data = load_list()
    mutants = [] if args.generated else hand_mutants(data)
    if not args.hand:
        mutants += generated_mutants(data, args.cap)
    if args.names:
        mutants = [m for m in mutants if any(m.name == n or (not m.hand and m.name.startswith(n)) for n in args.names)]
        if not mutants:
            raise MutantListError(f"no mutant is named {', '.join(args.names)} (see --list)")
    return mutants


def judged_equivalent(results: Sequence[Result], data: dict[str, Any]) -> list[Result]:
    """Survivors tools/mutants.toml's [[equivalent]] entries explain: the same behaviour for every input
    spawn.py gives the function (matched by the mutated line's text, which line shifts don't change)."""
    why = {(e["file"], e["line"].strip()): e["why"] for e in data.get("equivalent", [])}
    judged = []
    for r in results:
        reason = why.get((r.mutant.file, r.detail.strip())) if r.verdict == "survived" and not r.mutant.hand else None
        judged.append(dataclasses.replace(r, verdict="equivalent", detail=f"{r.detail} (equivalent: {reason})") if reason else r)
    return judged


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        mutants = chosen(args)
    except MutantListError as exc:
        print(f"mutants: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.name}  {m.file}:{m.line}  tests: {' '.join(m.tests)}")
        return 0
    results = judged_equivalent(run_all(mutants, args.python or sys.executable, args.jobs), load_list())
    print("\n".join(["", *report(results)]))
    failed = [r for r in results if r.mutant.hand and r.verdict in ("survived", "timeout", "baseline-red", "invalid")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
