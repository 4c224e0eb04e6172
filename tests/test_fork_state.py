"""Process-wide state a fork must reset lives in one registry (core/forkstate.py), and nothing escapes it.

Unit tests: the checker reads spawn.py, the product, as text (ast): every
module of the package as it runs, and none of the programs that run in
processes of their own (they are string constants there).
"""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest
from conftest import ROOT

import spawn

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
    found |= rebound_globals(tree) & module_level_names(tree)
    objects = {
        t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) for t in n.targets if isinstance(t, ast.Name)
    }
    found |= objects & assigned_class_attributes(tree) - set(classes)
    for name, klass in classes.items():
        # cls.attr = ... in the class's own methods: a class used as process state.
        for inner in ast.walk(klass):
            if isinstance(inner, ast.Assign) and any(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "cls" for t in inner.targets
            ):
                found.add(name)
    return found


def module_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def rebound_globals(tree: ast.AST) -> set[str]:
    """Names a function declares `global` and binds: a module-level value that the code replaces."""
    found: set[str] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        declared = {name for node in ast.walk(function) if isinstance(node, ast.Global) for name in node.names}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del) and node.id in declared:
                found.add(node.id)
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


def spawn_state(source: str) -> set[str]:
    """spawn.py's process-wide state (source: its text): each module's, judged against what the whole file changes."""
    tree = ast.parse(source)
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    return process_state(source, mutated_names(tree)) | (classes & assigned_class_attributes(tree))


def unregistered(source: str) -> set[str]:
    return spawn_state(source) - set(spawn.FORK_RESETS) - set(spawn.KEPT_ACROSS_FORKS)


SPAWN_PY = ROOT / "spawn.py"


def test_every_piece_of_process_state_is_reset_on_fork_or_kept_for_a_reason_unit() -> None:
    missing = unregistered(SPAWN_PY.read_text())
    assert not missing, f"{sorted(missing)}: register a reset with on_fork(NAME, RESET), or say in KEPT_ACROSS_FORKS why a fork may keep it"
    assert not set(spawn.FORK_RESETS) & set(spawn.KEPT_ACROSS_FORKS)
    # What the checker reads is what runs: every name it finds, and every name registered, is one of spawn's.
    stale = (spawn_state(SPAWN_PY.read_text()) | set(spawn.FORK_RESETS) | set(spawn.KEPT_ACROSS_FORKS)) - set(vars(spawn))
    assert not stale, f"{sorted(stale)}: registered or found, but spawn has no such name"


PLANTED = {
    "a cache filled in place": ("_cache: dict[str, int] = {}\n\n\ndef remember(key: str) -> None:\n    _cache[key] = 1\n", "_cache"),
    "a list grown": ("_seen = []\n\n\ndef see(x: int) -> None:\n    _seen.append(x)\n", "_seen"),
    "a flag rebound": ("_armed = False\n\n\ndef arm() -> None:\n    global _armed\n    _armed = True\n", "_armed"),
    "a counter added to": ("_count = 0\n\n\ndef bump() -> None:\n    global _count\n    _count += 1\n", "_count"),
    "an object changed": ("class Holder:\n    pass\n\n\nHELD = Holder()\n\n\ndef hold() -> None:\n    HELD.value = 1\n", "HELD"),
}


@pytest.mark.parametrize("planted", PLANTED)
def test_state_planted_in_spawn_py_fails_the_check_until_registered_unit(planted: str) -> None:
    """The check above, on spawn.py with one more module at its end, as a new module would be bundled."""
    code, name = PLANTED[planted]
    source = SPAWN_PY.read_text() + "\n\n" + code
    assert unregistered(source) == {name}
    spawn.KEPT_ACROSS_FORKS[name] = "registered by this test"
    try:
        assert not unregistered(source)
    finally:
        del spawn.KEPT_ACROSS_FORKS[name]


def test_each_registered_reset_empties_what_it_resets_unit() -> None:
    """Every container registered with on_fork, filled as a parent process would, is empty after reset_after_fork."""
    containers = {name: getattr(spawn, name) for name in spawn.FORK_RESETS if isinstance(getattr(spawn, name), list | set | dict)}
    assert containers  # GUARDS_ABOVE and LOGS_TRUNCATED at least
    for value in containers.values():
        if isinstance(value, list):
            value.append(object())
        elif isinstance(value, set):
            value.add(object())
        else:
            value[object()] = object()
    spawn.reset_after_fork()
    assert {name: value for name, value in containers.items() if value} == {}


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
