#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.11"
# dependencies = []
# ///
"""Write spawn.py from the package under src/spawnlib: the amalgamation users copy.

    python3 tools/bundle.py            # write spawn.py
    python3 tools/bundle.py --check    # exit 1 if spawn.py is not what the package gives
    python3 tools/bundle.py --where 1234 5678     # the module lines behind spawn.py:1234
    python3 tools/bundle.py --traceback < tb.txt  # the same for every spawn.py line of a traceback

`uvx nox -s bundle` runs it. The generated file is one namespace, laid out as
SQLite lays out sqlite3.c: the package's __init__.py (shebang, PEP 723 block,
docstring, version), then the stand-in, then one combined import block, then
every other module in MODULES order, each under a banner naming its source.
Every line of a module keeps its own line in spawn.py: its imports become
blank lines (relative ones name nothing in one namespace; the others are in
the combined block), so spawn.py's line N maps back by an offset.

The embedded module ends in the placeholder `BUILTIN_FILES: dict[str, str] = {}`,
which the bundler fills with the texts of the files spawn.py ships built in
(EMBEDDED_FOLDERS: the output schemas, the default agents, the workflows), so
a changed file there makes spawn.py stale too.

Standard library only, deterministic: the same package always gives the same
bytes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import os
import re
import sys
import token as tokens
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "spawnlib"
TARGET = ROOT / "spawn.py"

# The order of the generated file: each module comes after those it needs at
# import time (a function body may name anything: the whole file is defined by
# the time main() runs).
STAND_IN = "core/prelude"  # runs before the combined imports: keeps its own
EMBEDDED = "core/embedded"  # ends in the placeholder the bundler fills
# The layers, lowest first: a module imports only from its own folder and the
# folders before it (tests/test_layers.py), and MODULES lists them in this order.
LAYERS = ("core", "session", "supervise", "policy", "run", "cli")
MODULES = (
    # core: constants, errors, records, pure functions; the prelude first of all
    STAND_IN,
    "core/constants",
    "programs/fast_start_hook",  # both: spawn.py runs its functions, and writes its text as the hook
    "programs/sandbox_client",  # both: main() runs it, and the stand-in compiles its text inside a sandbox
    EMBEDDED,
    "core/errors",
    "core/output",
    "core/forkstate",
    "core/records",
    "core/schemafast",
    "core/pure",
    "core/settings",
    "core/placement",
    # session: the on-disk protocol
    "session/protocol",
    "session/ledger",
    # supervise: processes, the compiled copy, Ray's seam, the commit point
    "supervise/fast_start",
    "supervise/supervisor",
    "supervise/calls",
    "supervise/cluster",
    "supervise/commit",
    # policy: admission, definitions and rules, asks, budget and inbox
    "policy/admission",
    "policy/agents",
    "policy/model_router",
    "policy/writable",
    "policy/delegates",
    "policy/channel",
    "policy/upstream",
    "policy/gateway",
    "policy/steering",
    # run: one agent from its flags to its outcome
    "run/running",
    "run/subagents",
    "run/inprocess",
    "run/claude",
    "run/executors",
    "run/resolving",
    "run/forkserver",
    "run/broker",
    "run/runner",
    # cli: the entry points
    "cli/verbs",
    "cli/options",
    "cli/dag",
    "cli/commands",
    "cli/steering_verbs",
    "cli/main",
    # After main's `if __name__ == "__main__":` block, which ends the process:
    # a CLI run (every agent, at every depth) never executes the Python API's
    # definitions; `import spawn` does.
    "cli/api",
)
# Programs passed as text (src/spawnlib/programs): each module-level
# `NAME = program_text("name")` of a bundled module becomes NAME's literal
# source, so ruff and mypy check the program and spawn.py never reads a file.
PROGRAMS_FOLDER = "programs"
PROGRAMS = ("stand_in_wait", "guard_wait", "guard_above", "fast_start_hook", "uv_shim", "sandbox_client")
PROGRAM_ACCESSOR = "program_text"
# The fast-start hook runs the stand-in's code from spawn.py's own bytes,
# found between two marker lines that it defines and the bundler writes: the
# first before the stand-in module's first line, the second before its last
# statement, the `if __name__ == "__main__"` that calls it.
HOOK = "programs/fast_start_hook"
MARKERS = ("STAND_IN_BEGIN", "STAND_IN_END")
BEGIN = "# " + "=" * 20 + " begin {path} " + "=" * 20 + "\n"
END = "# " + "=" * 20 + " end {path} " + "=" * 20 + "\n"
IMPORTS_BANNER = "# " + "=" * 20 + " imports of every module " + "=" * 20 + "\n"
LINE_LENGTH = 140  # ruff.toml's
# What spawn.py carries built in: (folder, file pattern). The schemas named in
# the package's RECORD_SCHEMAS describe spawn.py's own records, which an agent
# never answers with: those stay out.
EMBEDDED_FOLDERS = (("schemas", "*.json"), (".claude/agents", "*.md"), ("workflows", "*.yaml"))
PLACEHOLDER = "BUILTIN_FILES"
EMBEDDED_CHUNK = 100  # characters of a file per string literal: its lines stay under LINE_LENGTH


# Tokens that can hold a string's lines: f-strings (3.12+) come in parts.
STRING_TOKENS = {tokens.STRING, *(getattr(tokens, name) for name in ("FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokens, name))}
# What spawn.py says of itself under its PEP 723 block: {version} and {digest} filled in.
STAMP = (
    "# GENERATED by tools/bundle.py from the package src/spawnlib: do not edit this file.\n"
    "# Edit the package, then run `uvx nox -s bundle`. `python3 tools/bundle.py --where LINE`\n"
    "# names the module line behind any line here.\n"
    "# version {version}; sources sha256 {digest} (src/spawnlib and the built-in files)\n"
)


class BundleError(Exception):
    """The package can't be bundled; the message says why."""


@dataclass
class Imports:
    """The combined top-level imports of the modules after the stand-in."""

    plain: set[tuple[str, str | None]] = field(default_factory=set)  # import X [as Y]
    comments: dict[tuple[str, str | None], str] = field(default_factory=dict)  # the first module's why, for import X
    names: dict[str, set[tuple[str, str | None]]] = field(default_factory=dict)  # from X import N [as Y]
    type_checking: set[tuple[str, str | None]] = field(default_factory=set)  # if TYPE_CHECKING: import X

    def add(self, node: ast.Import | ast.ImportFrom, *, typing_only: bool = False) -> None:
        if isinstance(node, ast.Import):
            (self.type_checking if typing_only else self.plain).update((a.name, a.asname) for a in node.names)
        else:
            if typing_only:
                raise BundleError("only `import X` goes under `if TYPE_CHECKING:`")
            self.names.setdefault(node.module or "", set()).update((a.name, a.asname) for a in node.names)


@dataclass
class Module:
    name: str
    path: Path
    lines: list[str]  # with line ends
    blank: set[int]  # 0-based lines spawn.py leaves out: the imports (one namespace, one import block)
    defines: set[str]
    # 0-based line -> (module lines it replaces, the lines spawn.py has instead): inlined programs, markers
    edits: dict[int, tuple[int, list[str]]] = field(default_factory=dict)
    # 0-based line of an edit -> (a program, and for each of its lines the index of its first literal line there)
    inlined: dict[int, tuple[Module, list[int]]] = field(default_factory=dict)
    # 0-based lines inside a string that spans lines: a blank one there is the string's, never dropped
    in_string: set[int] = field(default_factory=set)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" and not node.orelse


def defined_names(body: list[ast.stmt]) -> set[str]:
    """Top-level names a module binds, imports aside."""
    names: set[str] = set()
    for node in body:
        targets: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, ast.If) and not is_type_checking(node):
            names |= defined_names(node.body) | defined_names(node.orelse)
        elif isinstance(node, ast.Try):
            names |= defined_names(node.body) | defined_names(node.orelse) | defined_names(node.finalbody)
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.If):
            names |= {n.target.id for n in ast.walk(node.test) if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name)}
    return names


def load(name: str, imports: Imports, keep_imports: bool) -> Module:
    path = PACKAGE / f"{name}.py"
    text = path.read_text()
    if not text.endswith("\n"):
        raise BundleError(f"{relative(path)}: no newline at the end")
    tree = ast.parse(text, filename=str(path))
    lines = text.splitlines(keepends=True)
    blank: set[int] = set()

    def drop(node: ast.stmt) -> None:
        assert node.end_lineno is not None
        blank.update(range(node.lineno - 1, node.end_lineno))

    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            if [a.name for a in node.names] != ["annotations"]:
                raise BundleError(f"{relative(path)}:{node.lineno}: the only future import is annotations")
            drop(node)
        elif isinstance(node, ast.ImportFrom) and node.level:
            drop(node)  # one namespace: the name is already there
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and (not keep_imports or getattr(node, "module", None) == "typing"):
            # The stand-in keeps the imports it runs with; its typing names are for annotations only.
            imports.add(node)
            comment = lines[node.lineno - 1][node.end_col_offset or 0 :].strip()
            if isinstance(node, ast.Import) and node.lineno == node.end_lineno and comment.startswith("#"):
                for a in node.names:
                    imports.comments.setdefault((a.name, a.asname), comment)
            drop(node)
        elif is_type_checking(node) and not keep_imports:
            assert isinstance(node, ast.If)
            for sub in node.body:
                if not isinstance(sub, ast.Import):
                    raise BundleError(f"{relative(path)}:{sub.lineno}: only imports go under `if TYPE_CHECKING:`")
                imports.add(sub, typing_only=True)
            drop(node)
    for inner in ast.walk(tree):
        if isinstance(inner, ast.ImportFrom) and inner.level and inner not in tree.body:
            raise BundleError(f"{relative(path)}:{inner.lineno}: a relative import must be at the top level")
    return Module(name, path, lines, blank, defined_names(tree.body), in_string=string_lines(text))


def string_lines(text: str) -> set[int]:
    """The 0-based lines that a string literal spanning lines continues on."""
    inside: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in STRING_TOKENS and token.end[0] > token.start[0]:
            inside.update(range(token.start[0], token.end[0]))  # rows are 1-based: from the line after the start
    return inside


def program_literal(name: str, target: str) -> tuple[list[str], Module, list[int]]:
    """`target = (...)`: the program's source as implicitly joined literals, one or more a line;
    the program, and where each of its lines starts among those lines (for --where)."""
    path = PACKAGE / PROGRAMS_FOLDER / f"{name}.py"
    text = path.read_text()
    program = Module(f"{PROGRAMS_FOLDER}/{name}", path, text.splitlines(keepends=True), set(), set())
    out = [f"{target} = (  # {relative(path)}, inlined by tools/bundle.py\n"]
    starts: list[int] = []
    for line in program.lines:
        starts.append(len(out))
        out += [f"    {chunk!r}\n" for chunk in split_chunks(line)]
    return [*out, ")\n"], program, starts


def inline_programs(module: Module) -> None:
    """Each module-level `NAME = program_text("name")` becomes NAME's literal; any other use is refused."""
    tree = ast.parse("".join(module.lines))
    inlined: set[int] = set()  # the accessor's own Name nodes in the calls replaced
    for node in tree.body:
        call = node.value if isinstance(node, ast.Assign) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == PROGRAM_ACCESSOR):
            continue
        assert isinstance(node, ast.Assign) and node.end_lineno is not None
        args = [a.value for a in call.args if isinstance(a, ast.Constant)]
        where = f"{relative(module.path)}:{node.lineno}"
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name) or len(args) != 1 or call.keywords:
            raise BundleError(f'{where}: a program is inlined as `NAME = {PROGRAM_ACCESSOR}("program")`')
        if args[0] not in PROGRAMS:
            raise BundleError(f"{where}: no program {args[0]!r} in PROGRAMS of tools/bundle.py")
        lines, program, starts = program_literal(str(args[0]), node.targets[0].id)
        module.edits[node.lineno - 1] = (node.end_lineno - node.lineno + 1, lines)
        module.inlined[node.lineno - 1] = (program, starts)
        inlined.add(id(call.func))
    for inner in ast.walk(tree):
        if isinstance(inner, ast.Name) and inner.id == PROGRAM_ACCESSOR and id(inner) not in inlined:
            raise BundleError(
                f"{relative(module.path)}:{inner.lineno}: {PROGRAM_ACCESSOR} is only for `NAME = {PROGRAM_ACCESSOR}(...)` at the top level"
            )


def hook_markers() -> tuple[str, str]:
    """The hook's STAND_IN_BEGIN and STAND_IN_END: bytes literals of one line each, between newlines."""
    path = PACKAGE / f"{HOOK}.py"
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in MARKERS:
            found[getattr(node.targets[0], "id", "")] = ast.literal_eval(node.value)
    markers: list[str] = []
    for name in MARKERS:
        marker = found.get(name)
        if not (isinstance(marker, bytes) and marker.startswith(b"\n#") and marker.endswith(b"\n") and marker.count(b"\n") == 2):
            raise BundleError(f"{relative(path)}: {name} must be a bytes literal of one comment line between newlines")
        markers.append(marker.decode()[1:])
    return markers[0], markers[1]


def mark_stand_in(module: Module) -> None:
    """Write the hook's markers around the stand-in's code: before its first line and its closing call."""
    begin, end = hook_markers()

    def closing(node: ast.stmt) -> bool:
        names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)} if isinstance(node, ast.If) else set()
        return {"__name__", "forkserver_stand_in"} <= names

    # What follows the closing call (the imports at first use) runs in a spawn
    # that goes on, and is not the hook's.
    last = next((node for node in ast.parse("".join(module.lines)).body if closing(node)), None)
    if last is None:
        raise BundleError(f'{relative(module.path)} must close with `if __name__ == "__main__" and ... forkserver_stand_in(...)`')
    module.edits[0] = (0, [begin])
    module.edits[last.lineno - 1] = (0, [end])


def module_lines(module: Module, kept: int, first: int) -> tuple[list[str], list[tuple[int, int, Module, int]]]:
    """The module's first kept lines as spawn.py has them from line first, and the spans that map back.

    Imports are left out (the file has one import block), and so is a blank
    line that would make a run of more than two: the spans, not offsets, map
    each spawn.py line back to its module line (--where, --traceback).
    """
    out: list[str] = []
    spans: list[tuple[int, int, Module, int]] = []
    start = i = 0
    blanks = 0  # blank lines at the end of out

    def close() -> None:
        if i > start:
            spans.append((first + len(out) - (i - start), i - start, module, start + 1))

    while i < kept:
        if i in module.edits:
            close()
            skip, lines = module.edits[i]
            program, starts = module.inlined.get(i, (None, []))
            spans += [(first + len(out) + at, 1, program, n) for n, at in enumerate(starts, 1) if program is not None]
            out += lines
            blanks = 0 if lines else blanks
            i += skip
            start = i
            if skip:
                continue
        line = module.lines[i]
        empty = not line.strip() and i not in module.in_string
        if i in module.blank or (empty and blanks >= 2):
            close()
            i += 1
            start = i
            continue
        out.append(line)
        blanks = blanks + 1 if empty else 0
        i += 1
    close()
    return out, spans


def sort_key(name: str) -> tuple[int, str]:
    """isort's order by type, as ruff sorts: CONSTANTS, Classes, functions."""
    if name.isupper() and len(name) > 1:
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


def alias(name: str, asname: str | None) -> str:
    return f"{name} as {asname}" if asname else name


def import_block(imports: Imports, already: set[str]) -> list[str]:
    """One import block, sorted as ruff's isort sorts it (stdlib, then third party)."""
    sections: list[list[str]] = [[], []]

    def section(module: str) -> list[str]:
        top = module.split(".", maxsplit=1)[0]
        return sections[0] if top in sys.stdlib_module_names or top == "__future__" else sections[1]

    for name, asname in sorted(imports.plain, key=lambda p: (p[0].lower(), p[1] or "")):
        if (asname or name) not in already:
            comment = imports.comments.get((name, asname))
            section(name).append(f"import {alias(name, asname)}{'  ' + comment if comment else ''}\n")
    froms: list[tuple[str, str]] = []
    for module, names in imports.names.items():
        plain = sorted(((n, a) for n, a in names if not a), key=lambda p: sort_key(p[0]))
        if plain:
            froms.append((module, ", ".join(n for n, _ in plain)))
        froms += [(module, alias(n, a)) for n, a in sorted(names) if a]
    for module, names_text in sorted(froms, key=lambda p: (p[0].lower(), " as " in p[1], p[1])):
        line = f"from {module} import {names_text}\n"
        if len(line) - 1 > LINE_LENGTH:
            line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in names_text.split(", ")) + ")\n"
        section(module).append(line)
    block: list[str] = []
    for part in sections:
        if part:
            block += [*part, "\n"]
    if imports.type_checking:
        block.append("if TYPE_CHECKING:\n")
        block += [f"    import {alias(n, a)}\n" for n, a in sorted(imports.type_checking)]
        block.append("\n")
    return block


def record_schemas(modules: list[Module]) -> frozenset[str]:
    """The package's RECORD_SCHEMAS: `frozenset({...})` of string literals, wherever it is defined."""
    for module in modules:
        for node in ast.parse("".join(module.lines)).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["RECORD_SCHEMAS"]:
                value = node.value
                if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset" and len(value.args) == 1:
                    with contextlib.suppress(ValueError):
                        names = ast.literal_eval(value.args[0])
                        if isinstance(names, set) and all(isinstance(n, str) for n in names):
                            return frozenset(names)
                raise BundleError(f"{relative(module.path)}:{node.lineno}: RECORD_SCHEMAS must be frozenset({{...}}) of names")
    raise BundleError("no module defines RECORD_SCHEMAS: the bundler needs it to leave the record schemas out")


def embedded_files(records: frozenset[str]) -> dict[str, str]:
    """What spawn.py carries built in, by repository path, in a fixed order."""
    files: dict[str, str] = {}
    for folder, pattern in EMBEDDED_FOLDERS:
        for path in sorted((ROOT / folder).glob(pattern)):
            if folder == "schemas" and path.stem in records:
                continue
            files[relative(path)] = path.read_text()
    return files


def placeholder_line(module: Module) -> int:
    """The 0-based line where the embedded module's closing placeholder starts."""
    last = ast.parse("".join(module.lines)).body[-1]
    target = last.target if isinstance(last, ast.AnnAssign) else None
    value = last.value if isinstance(last, ast.AnnAssign) else None
    if not (isinstance(target, ast.Name) and target.id == PLACEHOLDER and isinstance(value, ast.Dict) and not value.keys):
        raise BundleError(f"{relative(module.path)} must end with `{PLACEHOLDER}: dict[str, str] = {{}}`, which the bundler fills")
    if last.end_lineno != len(module.lines):
        raise BundleError(f"{relative(module.path)}:{last.end_lineno}: nothing may follow the {PLACEHOLDER} placeholder")
    return last.lineno - 1


def embedded_literal(files: dict[str, str]) -> list[str]:
    """The filled placeholder: each file as implicitly joined literals of at most EMBEDDED_CHUNK characters."""
    out = [f"{PLACEHOLDER}: dict[str, str] = {{\n"]
    for path, text in files.items():
        chunks = [part for line in text.splitlines(keepends=True) for part in split_chunks(line)]
        out.append(f"    {path!r}: (\n")
        out += [f"        {chunk!r}\n" for chunk in chunks] or ['        ""\n']
        out.append("    ),\n")
    out.append("}\n")
    return out


def split_chunks(line: str) -> list[str]:
    return [line[i : i + EMBEDDED_CHUNK] for i in range(0, len(line), EMBEDDED_CHUNK)]


@dataclass
class Bundle:
    text: str
    spans: list[tuple[int, int, Module, int]]  # (first spawn.py line, 1-based; line count; module; its first line there)


def bundle() -> Bundle:
    header = (PACKAGE / "__init__.py").read_text()
    # A folder's __init__.py holds its layer's docstring, and nothing spawn.py runs.
    on_disk = sorted(p.relative_to(PACKAGE).with_suffix("").as_posix() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    listed = set(MODULES) | {f"{PROGRAMS_FOLDER}/{name}" for name in PROGRAMS}
    if sorted(listed) != on_disk:
        raise BundleError(f"MODULES and PROGRAMS in tools/bundle.py and the files in src/spawnlib differ: {sorted(listed ^ set(on_disk))}")
    imports = Imports()
    modules = [load(name, imports, keep_imports=name == STAND_IN) for name in MODULES]
    for module in modules:
        inline_programs(module)
    mark_stand_in(modules[0])
    owners: dict[str, str] = {}
    for module in modules:
        for name in sorted(module.defines):
            if name in owners:
                raise BundleError(f"{name} is defined in both {owners[name]} and {relative(module.path)}: spawn.py is one namespace")
            owners[name] = relative(module.path)
    # What the stand-in imported for itself, the file has already.
    stand_in_tree = ast.parse(modules[0].path.read_text())
    already = {a.asname or a.name.split(".")[0] for n in stand_in_tree.body if isinstance(n, ast.Import) for a in n.names}

    embedded = embedded_files(record_schemas(modules))
    out: list[str] = [stamped(header, [PACKAGE / "__init__.py", *(m.path for m in modules), *program_paths()], embedded)]
    spans: list[tuple[int, int, Module, int]] = []
    for module in modules:
        if module.name == MODULES[1]:
            out += ["\n", IMPORTS_BANNER, *import_block(imports, already)]
        path = relative(module.path)
        out += ["\n", BEGIN.format(path=path)]
        first = sum(chunk.count("\n") for chunk in out) + 1
        # The embedded module's placeholder is filled: its text is the bundler's own.
        kept = placeholder_line(module) if module.name == EMBEDDED else len(module.lines)
        lines, module_spans = module_lines(module, kept, first)
        out += lines
        spans += module_spans
        if module.name == EMBEDDED:
            out += embedded_literal(embedded)
        out.append(END.format(path=path))
    text = "".join(out)
    return Bundle(text, spans)


def program_paths() -> list[Path]:
    return [PACKAGE / PROGRAMS_FOLDER / f"{name}.py" for name in ("__init__", *PROGRAMS)]


def stamped(header: str, sources: list[Path], embedded: dict[str, str]) -> str:
    """__init__.py's text with the STAMP after its PEP 723 block: what made the file, from what."""
    block_end = "\n# ///\n"
    if block_end not in header:
        raise BundleError(f"{relative(PACKAGE / '__init__.py')} must open with the PEP 723 block, closed by `# ///`")
    version = re.search(r'^__version__ = "([^"]+)"$', header, re.MULTILINE)
    if version is None:
        raise BundleError(f'{relative(PACKAGE / "__init__.py")} must set `__version__ = "X.Y.Z"`')
    digest = hashlib.sha256()
    for name, data in sorted([(relative(p), p.read_bytes()) for p in set(sources)] + [(k, v.encode()) for k, v in embedded.items()]):
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    head, _, rest = header.partition(block_end)
    return head + block_end + "\n" + STAMP.format(version=version.group(1), digest=digest.hexdigest()[:16]) + rest


def where(made: Bundle, line: int) -> str:
    for first, count, module, module_first in made.spans:
        if first <= line < first + count:
            return f"{relative(module.path)}:{line - first + module_first}"
    return f"spawn.py:{line}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if spawn.py differs from what the package gives")
    parser.add_argument("--where", type=int, nargs="+", metavar="LINE", help="print the module and line behind each of spawn.py's LINEs")
    parser.add_argument("--traceback", action="store_true", help="rewrite spawn.py's lines in a traceback on stdin")
    args = parser.parse_args(argv)
    try:
        made = bundle()
    except (BundleError, SyntaxError) as exc:
        print(f"bundle: error: {exc}", file=sys.stderr)
        return 2
    if args.where:
        print("\n".join(where(made, line) for line in args.where))
        return 0
    if args.traceback:
        pattern = re.compile(r'File "([^"]*spawn(?:-[0-9a-f]+\.[\w-]+\.pyc|\.py))", line (\d+)')
        for line in sys.stdin:
            sys.stdout.write(pattern.sub(lambda m: f'File "{where(made, int(m.group(2))).replace(":", chr(34) + ", line ", 1)}', line))
        return 0
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != made.text:
            print("bundle: error: spawn.py is not what src/spawnlib gives; run `uvx nox -s bundle` and commit it", file=sys.stderr)
            return 1
        return 0
    if write(made):
        print(f"bundle: wrote {relative(TARGET)} ({made.text.count(chr(10))} lines)", file=sys.stderr)
    return 0


def write(made: Bundle) -> bool:
    """Write spawn.py if it differs from made (the test session calls this too); whether it did."""
    if TARGET.exists() and TARGET.read_text() == made.text:
        return False
    # Through a rename: an interrupted run never leaves half a spawn.py, and
    # test sessions that write the same bytes at once never see a torn one.
    partial = TARGET.with_name(f".{TARGET.name}.{os.getpid()}.tmp")
    partial.write_text(made.text)
    partial.chmod(0o755)
    os.replace(partial, TARGET)
    return True


if __name__ == "__main__":
    sys.exit(main())
