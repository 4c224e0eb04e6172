"""tools/bundle.py: spawn.py is generated from src/spawnlib, and every line of it maps back.

The bundler runs on a copy of the package in tmp_path wherever a test
changes a module, so the checkout's own files are never touched.
"""

from __future__ import annotations

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
    module = root / "src" / "spawnlib" / "constants.py"
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
        path.write_text(path.read_text() + "\n")
        stale = bundler(root, "--check")
        assert stale.returncode == 1, path
        assert stale.stderr.startswith("bundle: error: spawn.py is not what src/spawnlib gives")
        assert bundler(root).returncode == 0
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
    with (root / "src" / "spawnlib" / "embedded.py").open("a") as fh:
        fh.write("\nLATER = 1\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "src/spawnlib/embedded.py must end with `BUILTIN_FILES: dict[str, str] = {}`" in proc.stderr


def test_two_modules_that_define_one_name_are_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    with (root / "src" / "spawnlib" / "dag.py").open("a") as fh:
        fh.write("\n\ndef read_json() -> None:\n    pass\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "read_json is defined in both src/spawnlib/protocol.py and src/spawnlib/dag.py" in proc.stderr
    assert (root / "spawn.py").read_bytes() == (ROOT / "spawn.py").read_bytes()  # nothing half-written


def test_a_module_the_bundler_does_not_list_is_refused(tmp_path: Path) -> None:
    root = copy_of_the_project(tmp_path)
    (root / "src" / "spawnlib" / "extra.py").write_text("X = 1\n")
    proc = bundler(root)
    assert proc.returncode == 2
    assert "extra" in proc.stderr


def test_every_line_maps_back_to_its_module() -> None:
    """A module's line N is spawn.py's line at its offset, or a blank line where the module imports."""
    lines = (ROOT / "spawn.py").read_text().splitlines()
    numbers = range(1, len(lines) + 1, 7)
    answers = bundler(ROOT, "--where", *map(str, numbers)).stdout.splitlines()
    assert len(answers) == len(numbers)
    for number, where in zip(numbers, answers, strict=True):
        path, _, line = where.rpartition(":")
        if path == "spawn.py":
            continue  # the header, the banners and the combined imports are the bundler's own
        source = (ROOT / path).read_text().splitlines()[int(line) - 1]
        if lines[number - 1] != source:
            assert lines[number - 1] == "", (number, where)
            assert source.lstrip().startswith(("import ", "from ", ")", "if TYPE_CHECKING")) or source.startswith("    "), where


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
