"""The docs can't drift from the code: every exit code, flag, verb and SPAWN_* variable is documented.

README.md is the front page; the reference is docs/*.md. What the code defines is read
from the code itself (the ExitCode enum, the argument parsers, the string literals of the
package and its runtime siblings), so a new flag or variable fails here until a page
documents it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

import spawn

README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_BYTES = 20_000  # a front page that reads in minutes
# The package, the runtime siblings that drive it and the scripted model: what users run.
# (Development tools, bench, soak, demo and bundle, document their flags in their docstrings.)
DEV_TOOLS = {"bench.py", "bench_cost.py", "soak.py", "demo.py", "bundle.py"}
SOURCES = [
    *sorted((ROOT / "src" / "spawnlib").rglob("*.py")),
    *sorted(p for p in (ROOT / "tools").glob("*.py") if p.name not in DEV_TOOLS),
]
ENV_READERS = ("get", "setdefault", "pop")  # environ.get("X") and kin
PUBLIC_VERBS = [v for v in spawn.VERBS if not v.startswith("_")]


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def docs_text() -> str:
    """The reference: docs/ alone (the front page may repeat it, never replace it)."""
    return "\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))


def mentions(text: str, token: str) -> bool:
    """token as a whole word: --max-depth is not --max-depth-x, SPAWN_DEPTH is not SPAWN_DEPTH_S."""
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", text) is not None


def test_readme_is_a_front_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move reference text to docs/"


def test_readme_test_command_is_what_ci_runs() -> None:
    """.ci/run must run the README's test command, and the demo it names must exist."""
    readme = README.read_text()
    block = re.search(r"## The two commands\n\n(?:<!--.*?-->\n)?```bash\n(.*?)```", readme, re.S)  # after its runnable mark
    assert block is not None, "README.md lost its 'The two commands' block"
    commands = [line.split("#", 1)[0].strip() for line in block[1].splitlines() if line.strip()]
    assert commands == ["uv run tools/demo.py", "uvx nox"]
    assert (ROOT / "tools" / "demo.py").is_file()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "uvx nox" in ci_lines


@pytest.mark.parametrize("code", list(spawn.ExitCode), ids=lambda c: c.name)
def test_every_exit_code_is_documented(code: spawn.ExitCode) -> None:
    table = (DOCS / "exit-codes.md").read_text()
    assert f"| {code.value} | `{code.name}` |" in table, f"docs/exit-codes.md has no row for {code.value} {code.name}"


def cli_flags() -> set[str]:
    flags = set(spawn.build_run_parser().long_flags())
    for verb in PUBLIC_VERBS:
        flags |= set(spawn.build_verb_parser(verb).long_flags())
    return flags - {"--help"}


def sibling_flags() -> dict[str, str]:
    """--flags the runtime siblings' parsers take (they are run, never imported, so read from their source)."""
    flags: dict[str, str] = {}
    for path in SOURCES:
        if path.parent.name != "tools":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                        flags[arg.value] = path.name
    return flags


def test_every_flag_is_documented() -> None:
    text = docs_text()
    assert len(cli_flags()) > 40, "the parsers' flags were not found"
    missing = sorted(f for f in cli_flags() if not mentions(text, f))
    assert not missing, f"spawn.py flags no page documents: {missing}"
    siblings = sibling_flags()
    assert {"--http", "--token-file", "--svg", "--scenario"} <= set(siblings), "the siblings' flags were not found"
    missing = sorted(f"{flag} ({tool})" for flag, tool in siblings.items() if not mentions(text, flag))
    assert not missing, f"tools' flags no page documents: {missing}"


def test_every_choice_of_a_flag_is_documented() -> None:
    """A flag's choices ({id,status,...} in --help) are named on some page."""
    text = docs_text()
    helps = [spawn.build_run_parser().format_help(), *(spawn.build_verb_parser(v).format_help() for v in PUBLIC_VERBS)]
    choices = {c for h in helps for group in re.findall(r"\{([\w,-]+)\}", h) for c in group.split(",")}
    missing = sorted(c for c in choices if c not in PUBLIC_VERBS and not mentions(text, c))
    assert not missing, f"choices no page names: {missing}"


def test_every_verb_is_in_the_cli_reference() -> None:
    spans = " ".join(re.findall(r"`([^`\n]+)`", (DOCS / "cli.md").read_text()))
    missing = [v for v in PUBLIC_VERBS if not re.search(rf"spawn\.py (?:[\w-]+\\?\|)*{re.escape(v)}(?![\w-])", spans)]
    assert not missing, f"verbs docs/cli.md has no row for: {missing}"


def env_names(path: Path) -> set[str]:
    """SPAWN_* string literals, and any variable name read through an environ-like .get/[...]."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"SPAWN_[A-Z0-9_]+", node.value):
            names.add(node.value)
        target: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            target, owner = node.slice, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and node.func.attr in ENV_READERS:
            target, owner = node.args[0], node.func.value
        if (
            target is not None
            and isinstance(target, ast.Constant)
            and isinstance(target.value, str)
            and re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", target.value)
            and "env" in ast.unparse(owner).lower()
        ):
            names.add(target.value)
    return names


def test_every_environment_variable_read_is_documented() -> None:
    text = docs_text()
    found = {name: path.name for path in SOURCES for name in env_names(path)}
    assert {"SPAWN_SESSION_ROOT", "SPAWN_NO_FORKSERVER", "CLAUDE_CODE_SIMPLE"} <= set(found), "the scan finds nothing"
    missing = sorted(f"{name} ({where})" for name, where in found.items() if not mentions(text, name))
    assert not missing, f"environment variables no page documents: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_links_between_pages_resolve() -> None:
    broken = []
    for page in [*pages(), ROOT / "sessions" / "README.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_history_or_issue_numbers_in_docs() -> None:
    """Docs say what is; history belongs in commit messages."""
    for page in pages():
        text = page.read_text()
        for pattern in (r"\bissues? #?\d+", r"(?<![\w&])#\d+\b", r"\bthe next day\b", r"\bbefore #", r"\bclosing notes\b"):
            hit = re.search(pattern, text, re.I)
            assert hit is None, f"{page.relative_to(ROOT)}: {hit[0]!r}" if hit else ""


def test_ci_page_quotes_the_example_verbatim() -> None:
    """The YAML shown in docs/ci.md is part of the tested workflow, line for line."""
    example = (DOCS / "examples" / "github-actions.yml").read_text().splitlines()
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "ci.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        lines = block.rstrip("\n").splitlines()
        start = example.index(lines[0])
        assert example[start : start + len(lines)] == lines, "docs/ci.md's YAML differs from docs/examples/github-actions.yml"


def test_claude_code_files_the_docs_name_exist() -> None:
    for relative in (".claude/skills/spawn/SKILL.md", ".claude/commands/spawn-tree.md", "tools/mcp_server.py", "tools/a2a_server.py"):
        assert (ROOT / relative).is_file(), relative
        assert relative in docs_text()


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs/README.md does not link: {unlisted}"
