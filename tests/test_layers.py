"""src/spawnlib forms layers: each module imports only modules listed before it in tools/bundle.py's MODULES.

Lazy (function-level) and TYPE_CHECKING imports count too: a lazy import that
reaches up is still a cycle, only hidden from the import system. So the order
of MODULES, the order of spawn.py and the layer picture in docs/architecture.md
are the import graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"


def module_order() -> list[str]:
    """MODULES as tools/bundle.py lists them, read from its source (tools/ is not a package)."""
    tree = ast.parse((ROOT / "tools" / "bundle.py").read_text(encoding="utf-8"))
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                constants[name] = node.value.value
            elif name == "MODULES" and isinstance(node.value, ast.Tuple):
                return [
                    str(element.value) if isinstance(element, ast.Constant) else constants[ast.unparse(element)]
                    for element in node.value.elts
                ]
    raise AssertionError("tools/bundle.py defines no MODULES tuple")


# `from .programs import program_text` is development-only (the bundler turns
# each program_text call into the program's literal source): no layer.
PROGRAM_TEXT = "programs"


def relative_imports(module: str) -> list[tuple[int, str]]:
    """(line, imported module, as MODULES names it) for every relative import anywhere in the module, at any depth."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    return [
        (node.lineno, node.module.replace(".", "/"))
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level >= 1 and node.module is not None and node.module != PROGRAM_TEXT
    ]


def test_every_module_is_listed() -> None:
    listed = {name for name in module_order() if "/" not in name}
    present = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert present == listed, "add a new module to tools/bundle.py MODULES in its layer's place"


def test_programs_import_nothing_of_the_package() -> None:
    """A program runs alone (python -I -S -c, or as the fast-start hook): it can't lean on any layer."""
    programs = sorted(p.stem for p in (PACKAGE / PROGRAM_TEXT).glob("*.py") if p.stem != "__init__")
    reaching = [f"{PROGRAM_TEXT}/{name}: {target}" for name in programs for _, target in relative_imports(f"{PROGRAM_TEXT}/{name}")]
    assert programs and reaching == []


def test_modules_import_only_modules_below_them() -> None:
    order = module_order()
    position = {name: index for index, name in enumerate(order)}
    upward = [
        f"src/spawnlib/{module}.py:{line} imports .{target}, listed at or after it in MODULES"
        for module in order
        for line, target in relative_imports(module)
        if position.get(target, len(order)) >= position[module]
    ]
    assert upward == [], "\n".join(upward)
