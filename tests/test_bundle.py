"""tools/bundle.py: spawn.py is generated from src/spawnlib, and every line of it maps back.

The bundler runs on a copy of the package in tmp_path wherever a test
changes a module, so the checkout's own files are never touched.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import spawn

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"


def bundler(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "tools" / "bundle.py"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def copy_of_the_project(tmp_path: Path) -> Path:
    """tools/bundle.py, src/spawnlib, the files spawn.py embeds and spawn.py, as the checkout has them."""
    (tmp_path / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "bundle.py", tmp_path / "tools")
    shutil.copytree(PACKAGE, tmp_path / "src" / "spawnlib", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("schemas", ".claude/agents", "workflows"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copy2(ROOT / "spawn.py", tmp_path)
    return tmp_path


def test_spawn_py_is_what_the_package_gives() -> None:
    proc = bundler(ROOT, "--check")
    assert proc.returncode == 0, proc.stderr


def test_a_stale_spawn_py_fails_the_check_until_it_is_written(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    module = root / "src" / "spawnlib" / "core" / "constants.py"
    module.write_text(module.read_text().replace("PROTOCOL_VERSION = 1", "PROTOCOL_VERSION = 1  # touched"))
    stale = bundler(root, "--check")
    assert stale.returncode == 1
    assert stale.stderr.startswith("bundle: error: spawn.py is not what src/spawnlib gives")
    assert bundler(root).returncode == 0
    assert "PROTOCOL_VERSION = 1  # touched\n" in (root / "spawn.py").read_text()
    assert bundler(root, "--check").returncode == 0


def test_the_same_package_gives_the_same_bytes(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    (root / "spawn.py").unlink()
    assert bundler(root).returncode == 0
    first = (root / "spawn.py").read_bytes()
    (root / "spawn.py").unlink()
    assert bundler(root).returncode == 0
    assert (root / "spawn.py").read_bytes() == first == (ROOT / "spawn.py").read_bytes()


def test_a_changed_builtin_file_makes_spawn_py_stale(tmp_path: Path) -> None:
    """The texts spawn.py carries are written from the files: a changed schema, agent or workflow is a stale spawn.py."""
    root = copy_of_the_project(tmp_path)
    for path in (root / "schemas" / "findings.json", root / ".claude" / "agents" / "plan.md", root / "workflows" / "plan-build.yaml"):
        text = path.read_text()
        path.write_text(text + "\n")
        stale = bundler(root, "--check")
        assert stale.returncode == 1, path
        assert stale.stderr.startswith("bundle: error: spawn.py is not what src/spawnlib gives")
        path.write_text(text)  # one file at a time: each alone makes spawn.py stale
    assert bundler(root, "--check").returncode == 0


def test_spawn_py_carries_the_output_schemas_agents_and_workflows_but_no_record_schema() -> None:
    """Unit test of the generated BUILTIN_FILES: each text is its file's, in a fixed order."""
    files = [p for p in sorted((ROOT / "schemas").glob("*.json")) if p.stem not in spawn.RECORD_SCHEMAS]
    files += sorted((ROOT / ".claude" / "agents").glob("*.md")) + sorted((ROOT / "workflows").glob("*.yaml"))
    assert list(spawn.BUILTIN_FILES) == [p.relative_to(ROOT).as_posix() for p in files]
    assert all(spawn.BUILTIN_FILES[p.relative_to(ROOT).as_posix()] == p.read_text() for p in files)
    assert {"findings.json", "review.json", "plan.json"} <= set(spawn.builtin_files("schemas"))
    assert not set(spawn.builtin_files("schemas")) & {f"{name}.json" for name in spawn.RECORD_SCHEMAS}


def test_the_embedded_module_must_end_with_its_placeholder(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    with (root / "src" / "spawnlib" / "core" / "embedded.py").open("a") as fh:
        fh.write("\nLATER = 1\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "src/spawnlib/core/embedded.py must end with `BUILTIN_FILES: dict[str, str] = {}`" in proc.stderr


def test_two_modules_that_define_one_name_are_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    with (root / "src" / "spawnlib" / "cli" / "dag.py").open("a") as fh:
        fh.write("\n\ndef read_json() -> None:\n    pass\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "read_json is defined in both src/spawnlib/session/protocol.py and src/spawnlib/cli/dag.py" in proc.stderr
    assert (root / "spawn.py").read_bytes() == (ROOT / "spawn.py").read_bytes()  # nothing half-written


def test_a_module_the_bundler_does_not_list_is_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    (root / "src" / "spawnlib" / "extra.py").write_text("X = 1\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "extra" in proc.stderr


def test_every_line_maps_back_to_its_module() -> None:
    """Every line of spawn.py that is a module's maps back to that very line (--where);
    an inlined program's line N starts a literal of it."""
    lines = (ROOT / "spawn.py").read_text().splitlines()
    program = lines.index("STAND_IN_WAIT = (  # src/spawnlib/programs/stand_in_wait.py, inlined by tools/bundle.py") + 1
    numbers = sorted({*range(1, len(lines) + 1, 5), *range(program, program + 60)})
    answers = bundler(ROOT, "--where", *map(str, numbers)).stdout.splitlines()
    assert len(answers) == len(numbers)
    mapped = 0
    for number, where in zip(numbers, answers, strict=True):
        path, _, line = where.rpartition(":")
        if path == "spawn.py":
            continue  # the header, the banners, the combined imports and the built-in files are the bundler's own
        mapped += 1
        source = (ROOT / path).read_text().splitlines()[int(line) - 1]
        if lines[number - 1] != source and "/programs/" in path and lines[number - 1].startswith(("    '", '    "')):
            assert (source + "\n").startswith(ast.literal_eval(lines[number - 1].strip())), where  # an inlined program's line
        else:
            assert lines[number - 1] == source, (number, where)
    assert mapped > len(numbers) // 2


def test_the_generated_file_says_what_it_is_and_from_what() -> None:
    """A header under the PEP 723 block: generated, from where, the version and the sources' hash."""
    text = (ROOT / "spawn.py").read_text()
    head = text.split('"""', 1)[0]
    assert "# GENERATED by tools/bundle.py from the package src/spawnlib: do not edit this file." in head
    assert f"# version {spawn.__version__}; sources sha256 " in head
    assert head.index("# ///\n") < head.index("# GENERATED")


def test_the_stamp_changes_with_any_source(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)

    def stamp() -> str:
        assert bundler(root).returncode == 0
        return next(line for line in (root / "spawn.py").read_text().splitlines() if "sources sha256" in line)

    first = stamp()
    module = root / "src" / "spawnlib" / "core" / "errors.py"
    module.write_text(module.read_text() + "\n# touched\n")
    second = stamp()
    workflow = root / "workflows" / "plan-build.yaml"
    workflow.write_text(workflow.read_text() + "\n")
    assert len({first, second, stamp()}) == 3


def test_no_runs_of_blank_lines_where_imports_were() -> None:
    """Imports leave no blank lines behind, and no run of more than two blank lines is left anywhere
    outside a string: the spans, not offsets, map the lines back."""
    text = (ROOT / "spawn.py").read_text()
    assert "\n\n\n\n" not in text


def test_a_traceback_names_the_modules() -> None:
    text = (ROOT / "spawn.py").read_text().splitlines()
    number = next(i for i, line in enumerate(text, 1) if line.startswith("def cmd_wait("))
    traceback = f'  File "/somewhere/spawn.py", line {number}, in cmd_wait\n'
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bundle.py"), "--traceback"], input=traceback, capture_output=True, text=True, check=True
    )
    path, line = proc.stdout.split('"')[1], int(proc.stdout.split("line ")[1].split(",")[0])
    assert path.startswith("src/spawnlib/")
    assert (ROOT / path).read_text().splitlines()[line - 1].startswith("def cmd_wait(")


PROGRAM_TEXTS = {
    "stand_in_wait": spawn.STAND_IN_WAIT,
    "guard_wait": spawn.GUARD_BOOTSTRAP,
    "guard_above": spawn.GUARD_ABOVE_BOOTSTRAP,
    "fast_start_hook": spawn.FAST_START_HOOK,
}


def test_each_program_is_inlined_as_its_module_s_source() -> None:
    for name, text in PROGRAM_TEXTS.items():
        assert text == (PACKAGE / "programs" / f"{name}.py").read_text(), name
    # No program is left behind as a call: spawn.py never reads the package.
    assert "program_text(" not in (ROOT / "spawn.py").read_text()


def test_the_programs_under_python_I_S_import_builtin_modules_only() -> None:
    """The stand-in's wait runs as `python -I -S -c` for every agent the fork server runs: a stdlib .py would cost its import.
    (The guard's wait, which runs only where there is no /bin/sh, imports os.)"""
    loaded = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import sys; print(*sys.modules)"], capture_output=True, text=True, check=True
    )
    bare = set(sys.builtin_module_names) | set(loaded.stdout.split())
    for name in ("stand_in_wait",):
        tree = ast.parse(PROGRAM_TEXTS[name])
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported <= bare, name
    for name, text in PROGRAM_TEXTS.items():
        # A future import is a real import at run time too: __future__.py, at every spawn or interpreter start.
        assert "from __future__" not in text, name


def constants_of(text: str) -> dict[str, object]:
    """A program's module-level NAME = literal assignments."""
    found: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def test_what_a_program_repeats_of_spawn_py_agrees_with_it() -> None:
    """A program can't import spawn.py's names when it runs on its own: its copies must agree."""
    assert constants_of(spawn.GUARD_BOOTSTRAP)["SETTLED"] == spawn.GUARD_SETTLED
    hook = constants_of(spawn.FAST_START_HOOK)
    assert hook["HOOK_ENV_CACHE_DIR"] == spawn.ENV_CACHE_DIR
    assert hook["HOOK_ENV_SESSION"] == spawn.ENV_SESSION
    assert hook["HOOK_ENV_NO_FORKSERVER"] == spawn.ENV_NO_FORKSERVER
    assert hook["HOOK_FORKSERVER_SOCKET"] == spawn.FORKSERVER_SOCKET
    assert hook["ANNOTATIONS_FLAG"] == __future__.annotations.compiler_flag
    assert ast.parse(spawn.GUARD_ABOVE_BOOTSTRAP)  # and it parses


def test_the_markers_enclose_the_stand_in_once_and_nothing_else() -> None:
    source = (ROOT / "spawn.py").read_bytes()
    begin, end = source.index(spawn.STAND_IN_BEGIN), source.index(spawn.STAND_IN_END)
    assert (source.count(spawn.STAND_IN_BEGIN), source.count(spawn.STAND_IN_END)) == (1, 1)
    assert source[:begin].endswith(b" begin src/spawnlib/core/prelude.py " + b"=" * 20)
    section = source[begin:end].decode()
    assert "def forkserver_stand_in(" in section and "\nimport argparse" not in section
    assert source[end + len(spawn.STAND_IN_END) :].startswith(b'if __name__ == "__main__" and (_served := forkserver_stand_in(')


def test_a_program_used_other_than_as_a_constant_is_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    with (root / "src" / "spawnlib" / "cli" / "dag.py").open("a") as fh:
        fh.write('\n\ndef later() -> str:\n    return program_text("guard_wait")\n')
    proc = bundler(root)
    assert proc.returncode == 2
    assert "src/spawnlib/cli/dag.py" in proc.stderr and "program_text is only for `NAME = program_text(...)`" in proc.stderr
    assert (root / "spawn.py").read_bytes() == (ROOT / "spawn.py").read_bytes()


def test_an_unlisted_program_is_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    (root / "src" / "spawnlib" / "programs" / "extra.py").write_text("X = 1\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "programs/extra" in proc.stderr
