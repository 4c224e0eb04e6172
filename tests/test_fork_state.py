"""Process-wide state a fork must reset lives in one registry (forkstate.py), and nothing escapes it.

Unit tests: the package's modules are read as text (ast), never run.
"""

from __future__ import annotations

import ast
import signal
from pathlib import Path

from conftest import ROOT

import spawn

PACKAGE = ROOT / "src" / "spawnlib"
MUTABLE_CALLS = {"list", "dict", "set", "deque", "defaultdict", "OrderedDict", "Counter", "bytearray"}
CACHES = {"cache", "lru_cache", "cached_property"}


MUTATORS = {"append", "extend", "insert", "add", "update", "clear", "pop", "popitem", "remove", "discard", "setdefault", "sort"}


def mutated_names(tree: ast.AST) -> set[str]:
    """Names whose value the code changes in place: NAME.append(...), NAME[key] = ..., del NAME[key]."""
    found: set[str] = set()
    for node in ast.walk(tree):
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Attribute) and call.attr in MUTATORS and isinstance(call.value, ast.Name):
            found.add(call.value.id)
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                found.add(target.value.id)
    return found


def process_state(source: str, mutated: set[str] | None = None) -> set[str]:
    """Names of a module's process-wide state: module-level mutables that the code changes
    (mutated: names changed anywhere in the package; else in this source), classes whose
    attributes are assigned at run time, and cached functions. A table built once and never
    changed is a constant, not state."""
    tree = ast.parse(source)
    mutated = mutated_names(tree) if mutated is None else mutated
    found: set[str] = set()
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        mutable = isinstance(value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in MUTABLE_CALLS
        )
        if mutable:
            found |= {t.id for t in targets if isinstance(t, ast.Name) and t.id in mutated}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if getattr(target, "attr", getattr(target, "id", None)) in CACHES:
                    found.add(node.name)
    for name, klass in classes.items():
        # cls.attr = ... in the class's own methods: a class used as process state.
        for inner in ast.walk(klass):
            if isinstance(inner, ast.Assign) and any(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "cls" for t in inner.targets
            ):
                found.add(name)
    return found


def assigned_class_attributes(tree: ast.AST) -> set[str]:
    """NAME for every NAME.attr = ... (a class of the package used as process state, if NAME is one)."""
    return {
        target.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
    }


def package_state() -> dict[str, set[str]]:
    """Each module's process-wide state, judged against what the whole package changes."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.glob("*.py"))}
    mutated = set().union(*(mutated_names(tree) for tree in trees.values()))
    assigned = set().union(*(assigned_class_attributes(tree) for tree in trees.values()))
    state = {}
    for path, tree in trees.items():
        classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        state[str(path.relative_to(ROOT))] = process_state(path.read_text(), mutated) | (classes & assigned)
    return state


def test_every_piece_of_process_state_is_reset_on_fork_or_kept_for_a_reason_unit() -> None:
    known = set(spawn.FORK_RESETS) | set(spawn.KEPT_ACROSS_FORKS)
    unlisted = {f"{module}: {name}" for module, names in package_state().items() for name in names - known}
    assert not unlisted, "register a reset with on_fork(NAME, RESET), or say in KEPT_ACROSS_FORKS why a fork may keep it"
    assert not set(spawn.FORK_RESETS) & set(spawn.KEPT_ACROSS_FORKS)


def test_the_checker_sees_new_state_of_each_kind_unit() -> None:
    source = """
import functools
NEW_LIST: list[int] = []
NEW_MAP = dict()
CONSTANT = (1, 2)
class Flag:
    raised = False
    @classmethod
    def raise_it(cls) -> None:
        cls.raised = True
TABLE = {"a": 1}
def grow() -> None:
    NEW_LIST.append(1)
    NEW_MAP["k"] = 2
@functools.cache
def remembered() -> int:
    return 1
"""
    assert process_state(source) == {"NEW_LIST", "NEW_MAP", "Flag", "remembered"}  # TABLE is never changed


def test_reset_after_fork_forgets_what_the_parent_process_held_unit() -> None:
    spawn.EarlyStop.pending = int(signal.SIGTERM)
    spawn.LOGS_TRUNCATED.add(Path("/somewhere/transcript.jsonl"))
    spawn.GUARDS_ABOVE.append((1, 2))
    try:
        spawn.reset_after_fork()
        assert spawn.EarlyStop.pending is None
        assert not spawn.LOGS_TRUNCATED
        assert not spawn.GUARDS_ABOVE
    finally:
        spawn.reset_after_fork()
