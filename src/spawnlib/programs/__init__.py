"""Programs that spawn.py passes as text: to `python -I -S -c`, or written as a file (the fast-start hook).

Each is a module of its own here, so ruff and mypy check it; tools/bundle.py
inlines its source as a string constant wherever the package writes
`NAME = program_text("module")`, so spawn.py never reads these files. A
program runs on builtin modules only (no site, no stdlib .py files), and it
is small: one runs at every nested spawn and for every agent's guard.
No program imports from __future__ (a real import of __future__.py at run
time); an annotation that would build objects when the def runs is quoted.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def program_text(name: str) -> str:
    """The source of the program `name` (development only: the bundle holds its literal text)."""
    return (FOLDER / f"{name}.py").read_text()
