"""src/spawnlib forms layers, as folders: a module imports only from its own folder and the folders below it.

LAYERS in tools/bundle.py names the folders, lowest first; MODULES lists every
module, folder by folder in that order, and within a folder each module after
those it imports. Lazy (function-level) and TYPE_CHECKING imports count too: a
lazy import that reaches up is still a cycle, only hidden from the import
system. docs/architecture.md's layer picture is checked against both.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# `from ..programs import program_text` is development-only (the bundler turns
# each program_text call into the program's literal source): programs/ holds
# texts, not a layer, and may be named from any layer.
PROGRAMS = "programs"


def bundler_tuple(name: str) -> list[str]:
    """A tuple of tools/bundle.py (MODULES, LAYERS), read from its source (tools/ is not a package)."""
    tree = ast.parse((ROOT / "tools" / "bundle.py").read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants[target] = node.value.value
            elif target == name and isinstance(node.value, ast.Tuple):
                return [
                    str(element.value) if isinstance(element, ast.Constant) else constants[ast.unparse(element)]
                    for element in node.value.elts
                ]
    raise AssertionError(f"tools/bundle.py defines no {name} tuple")


def module_order() -> list[str]:
    return bundler_tuple("MODULES")


def layers() -> list[str]:
    return bundler_tuple("LAYERS")


def folder_of(module: str) -> str:
    """The layer's folder of a module as MODULES names it (programs/ for the programs, or itself)."""
    return module.split("/", 1)[0]


def resolve(module: str, level: int, name: str | None) -> str:
    """The module, as MODULES names it, that `from <level dots><name>` in module imports ("" for the package itself)."""
    parts = module.split("/")[:-1]  # the folder the importing module is in
    base = parts[: len(parts) - (level - 1)]
    return "/".join([*base, *(name.split(".") if name else [])])


def relative_imports(module: str) -> list[tuple[int, str]]:
    """(line, imported module as MODULES names it) for every relative import anywhere in the module, at any depth."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    return [
        (node.lineno, resolve(module, node.level, node.module))
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level >= 1
    ]


def test_every_module_is_listed_and_every_folder_is_a_layer() -> None:
    listed = {name for name in module_order() if folder_of(name) != PROGRAMS}
    present = {p.relative_to(PACKAGE).with_suffix("").as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    present = {name for name in present if folder_of(name) != PROGRAMS}
    assert present == listed, "add a new module to tools/bundle.py MODULES in its layer's place"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} - {PROGRAMS}
    assert folders == set(layers())
    assert all("/" in name for name in listed), "every module lives in a layer's folder"


def test_modules_are_listed_folder_by_folder_lowest_first() -> None:
    seen = [folder_of(name) for name in module_order() if folder_of(name) != PROGRAMS]
    runs = [folder for i, folder in enumerate(seen) if i == 0 or seen[i - 1] != folder]
    assert runs == layers()


def test_every_layer_says_what_it_owns() -> None:
    """Each folder's __init__.py, and each module, opens with a docstring."""
    bare = [
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.parent.name != PROGRAMS and not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
    ]
    assert bare == []


def test_programs_import_nothing_of_the_package() -> None:
    """A program runs alone (python -I -S -c, or as the fast-start hook): it can't lean on any layer."""
    programs = sorted(f"{PROGRAMS}/{p.stem}" for p in (PACKAGE / PROGRAMS).glob("*.py") if p.stem != "__init__")
    reaching = [f"{name}: {target}" for name in programs for _, target in relative_imports(name)]
    assert programs and reaching == []


def test_a_module_imports_only_its_own_folder_and_the_folders_below() -> None:
    rank = {folder: index for index, folder in enumerate(layers())}
    upward = [
        f"src/spawnlib/{module}.py:{line} imports {target}, from a layer above {folder_of(module)}/"
        for module in module_order()
        if folder_of(module) in rank
        for line, target in relative_imports(module)
        if target and folder_of(target) != PROGRAMS and rank.get(folder_of(target), len(rank)) > rank[folder_of(module)]
    ]
    assert upward == [], "\n".join(upward)


def test_within_a_folder_modules_import_only_modules_listed_before_them() -> None:
    order = module_order()
    position = {name: index for index, name in enumerate(order)}
    upward = [
        f"src/spawnlib/{module}.py:{line} imports {target}, listed at or after it in MODULES"
        for module in order
        for line, target in relative_imports(module)
        if target and folder_of(target) != PROGRAMS and position.get(target, len(order)) >= position[module]
    ]
    assert upward == [], "\n".join(upward)


def test_the_layer_picture_in_the_docs_is_the_code() -> None:
    """docs/architecture.md's picture: each folder (top layer first) and under it each of its modules, as MODULES has them."""
    block = ARCHITECTURE.read_text(encoding="utf-8").split("## Layers", 1)[1].split("```", 2)[1]
    pictured: list[str] = []
    for line in block.splitlines():
        match = re.match(r"^\s*(\w+/(?:\w+)?)\s", line + " ")
        if match:
            pictured.append(match.group(1))
    expected: list[str] = []
    for folder in reversed(layers()):
        expected.append(f"{folder}/")
        expected += [name for name in reversed(module_order()) if folder_of(name) == folder]
    assert pictured == expected


# Where a process starts being spawn.py, and reads its environment (#47 item 3:
# configuration read once). Everything else takes what an edge read: a Settings
# (core/settings.py) or the `environ` it is handed.
ENVIRONMENT_EDGES = {
    "core/settings": "Settings.read, the one read of an edge",
    "core/prelude": "the fork server's stand-in, before anything else runs",
    "cli/main": "console_main and main: the CLI's edge",
    "cli/api": "the Python API's entry: the environment of the spawn.py it runs",
    "run/forkserver": "a forked runner's edge: it takes the environment its client sent",
    "policy/gateway": "the gateway's own process: it takes the real credential out of its environment",
    # Read where they are used, not yet handed down:
    "supervise/fast_start": "the compiled copy's folder, found once per process (SPAWN_CACHE_DIR)",
    "session/protocol": "the transcript cap in append_capped, which every log writer calls",
}


def environment_reads(module: str) -> list[int]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    ]


def test_the_environment_is_read_at_the_edges_only() -> None:
    """Below an edge, configuration comes in as an argument: a test can hand it, and it can't change under a run."""
    layered = [m for m in module_order() if folder_of(m) != PROGRAMS]
    reads = [f"src/spawnlib/{m}.py:{line} reads os.environ" for m in layered if m not in ENVIRONMENT_EDGES for line in environment_reads(m)]
    assert reads == [], "\n".join(reads)
    stale = [m for m in ENVIRONMENT_EDGES if not environment_reads(m)]
    assert stale == [], f"no longer read there: drop from ENVIRONMENT_EDGES: {stale}"
