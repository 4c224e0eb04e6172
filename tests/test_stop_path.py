"""Supervision has one home: every signal spawn.py sends goes through Supervised, and staleness has one rule.

A raw os.kill elsewhere is a stop path nobody reviews with the others: it may
signal a reused pid, or spawn.py's own group. The programs under
src/spawnlib/programs run on their own (the stand-in's wait, the guards) and
keep their own. Unit tests of the source, by ast.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"
STOP_PATH = ("supervise/supervisor.py", "Supervised")  # the module and class every signal goes through
# os.kill, os.killpg, signal.pthread_kill; psutil's and Popen's send_signal, terminate, kill.
SIGNALLING = {"kill", "killpg", "pthread_kill", "send_signal", "terminate"}


def modules() -> list[Path]:
    # programs/ holds the texts of programs of their own: not listed
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent.name != "programs")


def signals_outside(source: str, allowed_class: str | None) -> list[tuple[int, str]]:
    """(line, call) of each signalling call not inside class allowed_class."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    # A bare name signals only when it is os's or signal's (`from os import killpg`);
    # a function of the package's own that happens to be called kill does not.
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "signal")
        for alias in node.names
    }

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            here = inside or (isinstance(child, ast.ClassDef) and child.name == allowed_class)
            if isinstance(child, ast.Call) and not here:
                func = child.func
                bare = func.id if isinstance(func, ast.Name) and func.id in imported else None
                name = func.attr if isinstance(func, ast.Attribute) else bare
                if name in SIGNALLING:
                    found.append((child.lineno, ast.unparse(func)))
            visit(child, here)

    visit(tree, False)
    return found


def test_every_signal_goes_through_supervised() -> None:
    raw = [
        f"{path.relative_to(PACKAGE)}:{line} {call}"
        for path in modules()
        for line, call in signals_outside(
            path.read_text(encoding="utf-8"), STOP_PATH[1] if path.relative_to(PACKAGE).as_posix() == STOP_PATH[0] else None
        )
    ]
    assert not raw, f"send signals through Supervised (signal, stop, signal_pid, signal_group, signal_self) in {STOP_PATH[0]}: {raw}"


def test_the_check_finds_raw_signals() -> None:
    """The check itself: raw calls are found outside the class, and allowed inside it."""
    source = (
        "import os\nfrom os import killpg\n"
        "def f(proc):\n    os.kill(1, 9)\n    killpg(2, 15)\n    proc.terminate()\n"
        "class Supervised:\n    def g(self):\n        os.kill(3, 9)\n"
    )
    assert signals_outside(source, "Supervised") == [(4, "os.kill"), (5, "killpg"), (6, "proc.terminate")]
    assert [line for line, _ in signals_outside(source, None)] == [4, 5, 6, 9]


def test_staleness_is_decided_by_one_rule() -> None:
    """HEARTBEAT_STALE_BEATS is read in one function (processes.stale_in): status, wait and liveness agree."""
    uses = [
        f"{path.name}:{node.lineno}"
        for path in modules()
        if path.name != "constants.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Name) and node.id == "HEARTBEAT_STALE_BEATS"
    ]
    source = (PACKAGE / "supervise" / "supervisor.py").read_text(encoding="utf-8")
    stale_in = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "stale_in")
    assert uses == [f"supervisor.py:{n.lineno}" for n in ast.walk(stale_in) if isinstance(n, ast.Name) and n.id == "HEARTBEAT_STALE_BEATS"]
