"""src/spawnlib and tools/ stay readable: no function over 100 lines, no module over 1,500.

A function fits on a screen or two and a module in a sitting (docs/architecture.md);
ruff's branch and statement limits (ruff.toml) keep a function's shape in check,
this keeps its length. Nested functions and methods count on their own, and
within their enclosing function's lines too. tools/ is held to the same rules:
the runtime siblings and the dev tools (the bench, a package of its own) are
read and changed as often as the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"
TOOLS = ROOT / "tools"
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 1500


def sources() -> list[Path]:
    """Every Python file of the package and of tools/, subfolders included."""
    return sorted([*PACKAGE.rglob("*.py"), *TOOLS.rglob("*.py")])


def test_the_rules_cover_the_package_and_tools() -> None:
    names = {str(path.relative_to(ROOT)) for path in sources()}
    assert {"src/spawnlib/__init__.py", "tools/mcp_server.py", "tools/bench.py", "tools/benchlib/report.py"} <= names


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines) of every function and method, decorators excluded."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            found.append((node.name, node.lineno, node.end_lineno - node.lineno + 1))
    return found


def test_no_function_is_over_100_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sources()
        for name, line, length in function_lengths(path.read_text(encoding="utf-8"))
        if length > MAX_FUNCTION_LINES
    ]
    assert not long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_no_module_is_over_1500_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)} ({count} lines)"
        for path in sources()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"split these modules by concern (at most {MAX_MODULE_LINES} lines each): {long}"


def test_the_measure_counts_a_function_from_def_to_its_last_line() -> None:
    """The measure itself: a 101-line function is caught, a 100-line one is not, nested ones count on their own."""
    body = "".join(f"    x{i} = {i}\n" for i in range(99))
    nested = "class C:\n    def method(self):\n        def inner():\n            pass\n"
    source = f"def fits():\n{body}\n\nasync def over():\n{body}    y = 0\n\n{nested}"
    lengths = {name: length for name, _line, length in function_lengths(source)}
    assert lengths == {"fits": 100, "over": 101, "method": 3, "inner": 2}
