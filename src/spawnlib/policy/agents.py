"""Agent definitions (.claude/agents), permission rules and their decisions, routing, and node references."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import (
    CLAUDE_AGENT_FIELDS,
    DEFAULT_PERMISSION_MODE,
    EDIT_TOOLS,
    EFFORT_LEVELS,
    KNOWN_TOOLS,
    MEMORY_SCOPES,
    PERMISSION_KINDS,
    PERMISSION_MODES,
    PERMISSION_RANK,
    READ_TOOLS,
    ROUTE_B,
    ROUTE_K1,
    ROUTE_NAME_WEIGHT,
    ROUTE_STOPWORDS,
    ROUTE_THRESHOLD,
    ROUTE_WHEN_WEIGHT,
    SCHEMA_DIR,
    SPAWN_AGENT_FIELDS,
)
from ..core.embedded import builtin_files, builtin_label
from ..core.errors import InputError, UsageError, did_you_mean
from ..core.pure import DEFINITION_NUMBERS, MCP_SERVER_TYPES, canonical_tool, claude_config_dir, number_problem, parse_json
from ..core.records import Status
from ..session.protocol import cache_dir, load_input, read_input, write_file_atomic

# ------------------------------------------------- agents and permissions --


@dataclass(frozen=True)
class Rule:
    """A permission rule in Claude Code's syntax: Tool or Tool(specifier)."""

    tool: str
    spec: str | None
    text: str
    source: str = field(default="", compare=False)
    """where the rule came from: a flag, a definition or a settings file"""


@dataclass
class RuleSet:
    """An agent's permission rules, parsed, by kind."""

    allow: list[Rule] = field(default_factory=list)
    deny: list[Rule] = field(default_factory=list)
    ask: list[Rule] = field(default_factory=list)

    def texts(self) -> dict[str, list[str]]:
        return {kind: [r.text for r in getattr(self, kind)] for kind in PERMISSION_KINDS}


@dataclass
class AgentDefinition:
    """A .claude/agents/NAME.md file: frontmatter settings, body as system prompt."""

    name: str
    path: str
    source: str
    """project, user or built-in"""
    description: str = ""
    prompt: str = ""
    tools: list[str] | None = None
    disallowed_tools: list[str] = field(default_factory=list)
    model: str | None = None
    permission_mode: str | None = None
    skills: list[str] | None = None
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    mcp_server_refs: list[str] = field(default_factory=list)
    """Servers named but configured elsewhere (.mcp.json); resolve_mcp_refs fills them in."""
    schema: str | None = None
    max_depth: int | None = None
    timeout: float | None = None
    max_budget_usd: float | None = None
    permissions: RuleSet = field(default_factory=RuleSet)
    max_turns: int | None = None
    effort: str | int | None = None
    initial_prompt: str | None = None
    background: bool = False
    isolation: str | None = None
    """worktree: run in a fresh git worktree of the project."""
    memory: str | None = None
    """user, project or local: the agent's persistent memory directory."""
    hooks: dict[str, Any] | None = None
    """Claude Code's hooks setting (event -> matchers), passed to the CLI as settings."""
    color: str | None = None
    omit_claude_md: bool = False
    auto_compact_window: int | None = None
    kind: str = "claude"
    """claude, or a2a (with url) or command (with command): see the executors section."""
    endpoint: str | None = None
    """The definition's url (a2a) or command (command)."""


@dataclass(frozen=True)
class Problem:
    """A lint finding: file, line, message; errors fail lint, warnings don't."""

    path: str
    line: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.severity}: {self.message}"


class RuleSyntaxError(UsageError):
    def __init__(self, text: str, why: str = "") -> None:
        why = f" ({why})" if why else ""
        super().__init__(f"bad permission rule {text!r}{why}; use Tool or Tool(specifier), e.g. 'Bash(git diff:*)' or 'Read(./src/**)'")


class UnknownAgentDefinitionError(UsageError):
    def __init__(self, name: str, searched: Sequence[Path], known: Iterable[str] = ()) -> None:
        where = ", ".join([*(str(p) for p in searched), "the built-in agents"])
        if hint := did_you_mean(name, known):
            super().__init__(f"no agent definition {name!r}{hint} (searched {where}; for a new one: 'spawn.py agents new {name}')")
        else:
            super().__init__(f"no agent definition {name!r} in {where}; run 'spawn.py agents list' or 'spawn.py agents new {name}'")


def parse_rule(text: str, source: str = "") -> Rule:
    """A rule in Claude Code's syntax, checked as Claude Code checks it.

    Rules may span lines (settings files hold long Bash commands); legacy tool
    names are canonicalised so `Task(*)` also covers `Agent`.
    """
    m = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9_\-]*(?:__\*)?)(?:\((.*)\))?\s*", text, re.DOTALL)
    if not m:
        raise RuleSyntaxError(text)
    tool, spec = canonical_tool(m.group(1)), m.group(2)
    if tool.endswith("__*") and (not tool.startswith("mcp__") or tool.count("__") != 2):
        raise RuleSyntaxError(text, "a wildcard is only allowed as mcp__server__*")
    if tool not in KNOWN_TOOLS and not tool.startswith("mcp__"):
        raise RuleSyntaxError(text, f"unknown tool {tool!r}")
    if tool.startswith("mcp__") and spec not in (None, "*"):
        raise RuleSyntaxError(text, "MCP rules take no parentheses; use mcp__server, mcp__server__* or mcp__server__tool")
    if spec is not None and spec.strip() == "" and "(" in text:
        raise RuleSyntaxError(text, "empty parentheses; write the tool name alone to cover all of it")
    if tool == "WebFetch" and spec not in (None, "*") and not spec.startswith("domain:"):
        raise RuleSyntaxError(text, "WebFetch rules take 'domain:HOST'")
    if tool == "Bash" and spec is not None and ":*" in spec and not spec.endswith(":*"):
        raise RuleSyntaxError(text, "':*' is only allowed at the end of a Bash rule")
    return Rule(tool, None if spec in (None, "", "*") else spec, text.strip(), source)


def cli_rule(rule: Rule) -> str:
    """The rule as the CLI reads it: canonical tool name, same specifier."""
    return rule.tool if rule.spec is None else f"{rule.tool}({rule.spec})"


def rule_covers_tool(rule: Rule, tool: str) -> bool:
    tool = canonical_tool(tool)
    if rule.tool == tool:
        return True
    if rule.tool == "Read" and tool in READ_TOOLS:
        return True
    if rule.tool == "Edit" and tool in EDIT_TOOLS:
        return True
    if rule.tool.startswith("mcp__") and rule.tool.endswith("__*"):
        return tool.startswith(rule.tool[:-1])
    return rule.tool.startswith("mcp__") and rule.tool.count("__") == 1 and tool.startswith(rule.tool + "__")


# A shell command, cut into the parts a rule must hold for. Every command a
# line can run counts: each simple command, the ones inside $(...), `...`,
# <(...) and >(...), the strings given to sh -c and eval, and each redirection
# into a file. A command whose name is only known at run time ($x, rm${IFS})
# becomes DYNAMIC_COMMAND: it matches every deny rule and no allow rule.
DYNAMIC_COMMAND = "\0dynamic"
SUBSTITUTED = "\0subst"
SHELL_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", ";;", "(", ")", "{", "}", "\n"})
SHELL_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "time", "case", "esac"})
# Commands that run their arguments as a command: their options are skipped.
COMMAND_WRAPPERS = frozenset(
    {"command", "builtin", "exec", "env", "nohup", "nice", "time", "timeout", "xargs", "sudo", "doas", "setsid",
     "stdbuf", "ionice", "chrt", "taskset", "unbuffer"}
)  # fmt: skip
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
OUTPUT_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
SAFE_REDIRECT_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _closing(command: str, start: int, opener: str, closer: str) -> int:
    """Index of the closer matching an opener just before start (quotes respected)."""
    depth, i, quote = 1, start, ""
    while i < len(command):
        c = command[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(command)


def _lift_substitutions(command: str) -> tuple[str, list[str]]:
    """command with each substitution replaced by a placeholder word, and their bodies."""
    out, inner, i, quote = [], [], 0, ""
    while i < len(command):
        c = command[i]
        if quote == "'":
            quote = "" if c == "'" else quote
            out.append(c)
        elif c == "\\" and i + 1 < len(command):
            out.append(command[i : i + 2])
            i += 2
            continue
        elif command.startswith("$((", i):
            end = _closing(command, i + 3, "(", ")")
            out.append(SUBSTITUTED)  # arithmetic: no command, but not a literal either
            i = end + 2
            continue
        elif command.startswith(("$(", "<(", ">("), i):
            end = _closing(command, i + 2, "(", ")")
            inner.append(command[i + 2 : end])
            out.append(SUBSTITUTED)
            i = end + 1
            continue
        elif c == "`":
            end = command.find("`", i + 1)
            end = len(command) if end < 0 else end
            inner.append(command[i + 1 : end])
            out.append(SUBSTITUTED)
            i = end + 1
            continue
        elif c == "'" and quote != '"':
            quote = "'"
            out.append(c)
        elif c == '"':
            quote = "" if quote == '"' else '"'
            out.append(c)
        elif c == "\n" and not quote:
            out.append(" ; ")
        else:
            out.append(c)
        i += 1
    return "".join(out), inner


def _shell_words(command: str) -> list[str] | None:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the shell would refuse too, but don't guess
        return None


def _expand_name(name: str, environ: Mapping[str, str] | None, assigned: set[str]) -> str | None:
    """A command name built from variables the agent's shell inherits ("$SPAWN_PYTHON"),
    or None when the line itself could have set them (x=rm; $x) or they are unknown."""
    if environ is None:
        return None
    refs = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", name)
    if not re.fullmatch(r"(?:[^$`\\]|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})*", name):
        return None
    if any(r in assigned or r not in environ for r in refs):
        return None
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: environ[m.group(1)], name)


def _simple_command(words: list[str], depth: int, environ: Mapping[str, str] | None = None, assigned: set[str] | None = None) -> list[str]:
    """The parts of one simple command, after wrappers and assignments."""
    while words and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=.*", words[0], re.DOTALL) or words[0] in SHELL_KEYWORDS):
        words = words[1:]
    while words and os.path.basename(words[0]) in COMMAND_WRAPPERS:
        words = words[1:]
        while words and (words[0].startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?|[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.DOTALL)):
            words = words[1:]
    if not words:
        return []
    name = words[0]
    if "$" in name and SUBSTITUTED not in name:
        name = _expand_name(name, environ, assigned or set()) or name
    if "$" in name or SUBSTITUTED in name or any(ch in name for ch in "*?["):
        return [DYNAMIC_COMMAND]
    name = os.path.basename(name) if "/" in name else name
    args = words[1:]
    if name == "eval":
        return shell_command_parts(" ".join(args), depth + 1, environ)
    if name in SHELLS:
        for n, arg in enumerate(args):
            if arg.startswith("-") and not arg.startswith("--") and "c" in arg and n + 1 < len(args):
                return shell_command_parts(args[n + 1], depth + 1, environ)
    return [" ".join([name, *args])]


def shell_command_parts(command: str, depth: int = 0, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every command a shell line runs, normalised ('/bin/rm' -> 'rm', quotes removed).

    environ is the agent's shell environment: a command name made of its
    variables is read through it, unless the line could assign them itself.
    """
    assigned = set(re.findall(r"(?:^|[\s;&|(`])([A-Za-z_][A-Za-z0-9_]*)\+?=", command))
    setters = r"\b(?:read|for|export|declare|local|typeset|readonly|let|unset|printf\s+-v)\s+(?:-\S+\s+)*([A-Za-z_][A-Za-z0-9_]*)"
    assigned |= set(re.findall(setters, command))
    if depth > 8:
        return [DYNAMIC_COMMAND]  # deeper nesting than any honest command
    flat, inner = _lift_substitutions(command)
    words = _shell_words(flat)
    if words is None:
        return [DYNAMIC_COMMAND]
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in SHELL_SEPARATORS or (set(word) <= set(";&|()") and word not in OUTPUT_REDIRECTS):
            parts += _simple_command(current, depth, environ, assigned)
            current = []
        elif word in OUTPUT_REDIRECTS or word in ("<", "<<", "<<<", ">&", "<&"):
            target = words[i + 1] if i + 1 < len(words) else ""
            if current and current[-1].isdigit() and word in (">", ">>", ">&", "<&"):
                current.pop()  # 2>file: the 2 is the redirection's, not an argument
            if word in OUTPUT_REDIRECTS and target not in SAFE_REDIRECT_TARGETS and not target.isdigit():
                parts.append(f"> {target}")
            i += 2
            continue
        else:
            current.append(word)
        i += 1
    parts += _simple_command(current, depth, environ, assigned)
    for body in inner:
        parts += shell_command_parts(body, depth + 1, environ)
    return parts or [""]


def glob_to_regex(pattern: str) -> str:
    """A gitignore-style glob (**, *, ?) as a regex over a whole path."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def path_rule_matches(spec: str, path: str, cwd: str, home: str) -> bool:
    """Claude Code's path specifiers: //abs, ~/home, /project-root, ./rel, or a bare glob."""
    anchored = anchored_pattern(spec, cwd, home)
    if anchored is None:
        bare = "**/" + spec if not spec.startswith("**") else spec  # matches at any depth, as in gitignore
        return re.fullmatch(glob_to_regex(bare), path.lstrip("/")) is not None
    regex = glob_to_regex(anchored)
    # A directory (Grep's or Glob's path) matches when its contents do.
    return any(re.fullmatch(regex, candidate) for candidate in (path, path + "/")) or re.fullmatch(regex + "/.*", path) is not None


def bash_spec_matches(spec: str, command: str) -> bool:
    """One normalised command against a Bash specifier: `x:*` and `x *` are prefixes."""
    for suffix in (":*", " *"):
        if spec.endswith(suffix):
            prefix = spec[: -len(suffix)]
            return command == prefix or command.startswith(prefix + " ")
    return re.fullmatch(glob_to_regex(spec).replace("[^/]*", ".*").replace("[^/]", "."), command, re.DOTALL) is not None


def rule_matches(
    rule: Rule, tool: str, tool_input: Mapping[str, Any], cwd: str, home: str, *, all_parts: bool, environ: Mapping[str, str] | None = None
) -> bool:
    """Does rule cover this call? all_parts for allow rules: every part of a
    Bash command, and every spelling of a path, must match; for deny and ask
    rules one is enough."""
    tool = canonical_tool(tool)
    if not rule_covers_tool(rule, tool):
        return False
    if rule.spec is None:
        return True
    if tool == "Bash":
        parts = shell_command_parts(str(tool_input.get("command", "")), 0, environ)
        if all_parts:
            return all(p != DYNAMIC_COMMAND and bash_spec_matches(rule.spec, p) for p in parts)
        return any(p == DYNAMIC_COMMAND or bash_spec_matches(rule.spec, p) for p in parts)
    if tool in EDIT_TOOLS and (size := EDIT_SIZE_SPEC.fullmatch(rule.spec)):
        return changed_lines(tool, tool_input, cwd) > int(size.group(1))
    if tool in READ_TOOLS | EDIT_TOOLS:
        paths = tool_paths(tool, tool_input, cwd)
        if all_parts:
            return bool(paths) and all(path_rule_matches(rule.spec, p, cwd, home) for p in paths)
        return any(path_rule_matches(rule.spec, p, cwd, home) for p in paths) or search_reaches(rule, tool, tool_input, cwd, home)
    if tool == "WebFetch" and rule.spec.startswith("domain:"):
        host = re.sub(r"^[a-z]+://", "", str(tool_input.get("url", ""))).split("/")[0].split(":")[0]
        domain = rule.spec.removeprefix("domain:")
        return host == domain or host.endswith("." + domain)
    if tool == "Agent":
        return fnmatch_name(rule.spec, str(tool_input.get("subagent_type", "")))
    return re.fullmatch(glob_to_regex(rule.spec), json.dumps(tool_input, sort_keys=True)) is not None


# `Edit(lines>N)`: spawn.py's own specifier (Claude Code's Edit rules are paths
# only) for an edit that changes more than N existing lines: a refactor worth
# asking about. Meant for ask and deny rules, which spawn.py's hook decides.
EDIT_SIZE_SPEC = re.compile(r"lines>(\d+)")


def changed_lines(tool: str, tool_input: Mapping[str, Any], cwd: str) -> int:
    """How many existing lines an Edit, MultiEdit or Write would change (a new file changes none)."""
    import difflib

    def diff(old: str, new: str) -> int:
        ops = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).get_opcodes()
        return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")

    path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
    try:
        current = Path(path if os.path.isabs(path) else os.path.join(cwd, path)).read_text(errors="replace") if path else ""
    except OSError:
        current = ""
    edits = tool_input.get("edits") if tool == "MultiEdit" else [tool_input]
    if tool == "Write":
        return diff(current, str(tool_input.get("content", ""))) if current else 0
    if tool == "NotebookEdit":
        return len(str(tool_input.get("new_source", "")).splitlines())
    total = 0
    for e in edits if isinstance(edits, list) else []:
        if not isinstance(e, dict):
            continue
        old, new = str(e.get("old_string", "")), str(e.get("new_string", ""))
        times = max(1, current.count(old)) if e.get("replace_all") and old else 1
        total += diff(old, new) * times
    return total


def fnmatch_name(spec: str, name: str) -> bool:
    """Agent(a, b): any listed name (globs allowed) is the subagent's."""
    return any(re.fullmatch(glob_to_regex(s.strip()), name) for s in spec.split(",") if s.strip())


def tool_paths(tool: str, tool_input: Mapping[str, Any], cwd: str) -> list[str]:
    """The paths a call touches, each as written (normalised) and as resolved.

    Resolving follows symlinks, so `link/a.txt` with link -> secret is checked
    as secret/a.txt too: a rule must hold for both spellings of a target.
    """
    keys = ("file_path", "notebook_path", "path")
    found = [str(tool_input[k]) for k in keys if isinstance(tool_input.get(k), str)]
    if not found and tool in READ_TOOLS:
        found = [cwd]  # Grep and Glob search the working directory by default
    paths: list[str] = []
    for p in found:
        written = os.path.normpath(p if os.path.isabs(p) else os.path.join(cwd, p))
        paths += dict.fromkeys([written, os.path.realpath(written)])
    return paths


def anchored_pattern(spec: str, cwd: str, home: str) -> str | None:
    """A path rule as an absolute glob, or None for a bare glob that matches at any depth."""
    if spec.startswith("//"):
        return spec[1:]
    if spec.startswith("~/"):
        return home.rstrip("/") + spec[1:]
    if spec.startswith("/"):
        return cwd.rstrip("/") + spec
    if spec.startswith("./"):
        return cwd.rstrip("/") + spec[1:]
    if "/" not in spec.rstrip("/") or spec.startswith("**"):
        return None
    return cwd.rstrip("/") + "/" + spec


def search_reaches(rule: Rule, tool: str, tool_input: Mapping[str, Any], cwd: str, home: str) -> bool:
    """Could a Grep or Glob call read what a deny rule protects?

    A search whose root holds the rule's directory can list or read the
    files under it (with no path, or a glob such as secret/**), whatever the
    rule matches on the root itself. spawn.py doesn't trust the search to
    filter, so such a call is denied as a whole: narrow the path instead.
    Bare globs (`**/.env*`) have no directory to compare, so are left to the
    CLI's own filtering of results (it has the rule too).
    """
    if tool not in ("Grep", "Glob", "LS") or rule.spec is None:
        return False
    pattern = anchored_pattern(rule.spec, cwd, home)
    if pattern is None:
        return False
    fixed = re.split(r"[*?\[]", pattern)[0]
    if fixed == pattern or fixed.endswith("/"):
        protected = os.path.realpath(fixed.rstrip("/") or "/")
    else:  # secret* : whatever sits next to it
        protected = os.path.realpath(os.path.dirname(fixed) or "/")
    return any(protected == root or protected.startswith(root.rstrip("/") + "/") for root in tool_paths(tool, tool_input, cwd))


def kept_by_spawn_py(tool: str, tool_input: Mapping[str, Any], cwd: str, kept: Sequence[str], exempt: Sequence[str]) -> str | None:
    """The folder of spawn.py's own (kept: the session, the compiled copies'
    cache) that an Edit or Write call would write in, or None.

    No rule of a user's can grant these: every record there is trusted by
    other agents, and a copy there is run by every agent of every tree. An
    agent's own scratch/ and worktree are exempt; a link from them into a
    kept folder is not (tool_paths checks the resolved spelling too).
    """
    if canonical_tool(tool) not in EDIT_TOOLS:
        return None

    def inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    for path in tool_paths(tool, tool_input, cwd):
        if any(inside(path, e) for e in exempt):
            continue
        for folder in kept:
            if inside(path, folder):
                return folder
    return None


def settings_files(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """Claude Code's settings files that hold a user's permission rules, lowest precedence first."""
    config = claude_config_dir(environ)
    return [config / "settings.json", cwd / ".claude" / "settings.json", cwd / ".claude" / "settings.local.json"]


def load_settings_rules(cwd: Path, environ: Mapping[str, str]) -> RuleSet:
    """The allow, deny and ask rules of a user's settings files, each tagged with its file.

    Precedence between files doesn't matter for rules: deny beats ask beats
    allow whatever file each comes from, as in Claude Code.
    """
    found = RuleSet()
    for path in settings_files(cwd, environ):
        try:
            text = read_input(path)
            # Empty is no settings, as Claude Code reads it. Its own sandbox
            # makes one: bwrap binds /dev/null over a settings file that is
            # absent (so the sandboxed Bash can't create it), and the empty
            # mount point it leaves on the host lives as long as that Bash.
            data = load_input(text, str(path), "JSON") if text.strip() else {}
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise UsageError(f"can't read settings file {path}: {exc}; fix it or pass --no-settings") from None
        permissions = data.get("permissions") if isinstance(data, dict) else None
        if not isinstance(permissions, dict):
            continue
        for kind in PERMISSION_KINDS:
            texts = permissions.get(kind) or []
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise UsageError(f"{path}: permissions.{kind} must be a list of rule strings; fix it or pass --no-settings")
            for text in texts:
                try:
                    getattr(found, kind).append(parse_rule(text, str(path)))
                except RuleSyntaxError as exc:
                    raise UsageError(f"{path}: {exc}; fix it or pass --no-settings") from None
    return found


def most_specific_first(rules: Iterable[Rule]) -> list[Rule]:
    """Within one kind, the rule reported is the most specific that matches."""
    return sorted(rules, key=lambda r: (r.spec is None, -len(r.spec or "")))


def decide(
    tool: str,
    tool_input: Mapping[str, Any],
    rules: RuleSet,
    granted: Sequence[str],
    *,
    cwd: str,
    home: str,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, str | None]:
    """(allow|deny|ask, the rule or reason): deny wins, then ask, then allow.

    A granted tool with no allow rule of its own is allowed whole. Once a tool
    has specific allow rules, only calls matching one are allowed, as in
    Claude Code's dontAsk mode. environ is the agent's shell environment
    (see shell_command_parts).
    """
    tool = canonical_tool(tool)
    if tool == "StructuredOutput":
        return "allow", "the answer tool"
    for rule in most_specific_first(rules.deny):
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=False, environ=environ):
            return "deny", rule.text
    for rule in most_specific_first(rules.ask):
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=False, environ=environ):
            return "ask", rule.text
    own = most_specific_first(r for r in rules.allow if rule_covers_tool(r, tool))
    for rule in own:
        if rule_matches(rule, tool, tool_input, cwd, home, all_parts=True, environ=environ):
            return "allow", rule.text
    if any(r.spec is not None for r in own):
        return "deny", f"no allow rule of {tool} matches"
    if tool in granted or any(tool.startswith(g + "__") for g in granted if g.startswith("mcp__")):
        return "allow", f"{tool} is granted"
    return "deny", f"{tool} is not granted"


def cli_permissions(tools: Sequence[str], disallowed: Sequence[str], rules: RuleSet) -> tuple[list[str], list[str]]:
    """(allowed_tools, disallowed_tools) that give the CLI the allow and deny rules in its own form.

    The CLI then runs its own command and path checks too, and the stricter of
    the two layers wins: a call is made only if spawn.py's hook and the CLI
    both let it through. A granted tool with allow rules of its own is granted
    only through them, as in decide(). Ask rules stay with the hook alone: the
    CLI honours its own ask rule over a hook's answer, and in dontAsk mode
    that is a refusal, so an approved ask could never run.
    """
    allowed: list[str] = []
    for tool in tools:
        own = [cli_rule(r) for r in rules.allow if r.tool == tool and r.spec is not None]
        allowed += own or [tool]
    denied = [*disallowed, *(cli_rule(r) for r in rules.deny)]
    return list(dict.fromkeys(allowed)), list(dict.fromkeys(denied))


def bash_bypassable(rule: Rule) -> bool:
    """Can a Bash rule be got round by a command it doesn't name? Every deny or
    ask rule on Bash can: find -delete, an interpreter one-liner, a script."""
    return rule.tool == "Bash" and rule.spec is not None


def describe_rules(rules: RuleSet, tools: Sequence[str], disallowed: Sequence[str]) -> list[dict[str, Any]]:
    """Each effective rule, where it came from, and what reaches the CLI (for --dry-run)."""
    allowed_cli, denied_cli = cli_permissions(tools, disallowed, rules)
    rows: list[dict[str, Any]] = []
    for kind in PERMISSION_KINDS:
        for rule in most_specific_first(getattr(rules, kind)):
            cli = cli_rule(rule)
            row: dict[str, Any] = {"kind": kind, "rule": rule.text, "source": rule.source or "?"}
            row["cli"] = cli if cli in (allowed_cli if kind == "allow" else denied_cli) else None
            if kind != "allow" and bash_bypassable(rule):
                row["warning"] = (
                    "a Bash rule stops the commands it names, however spelled, but not another program doing the same "
                    "(find -delete, python -c, a script); only the sandbox is a boundary"
                )
            rows.append(row)
    return rows


def summarize_input(tool_input: Mapping[str, Any], limit: int = 300) -> str:
    text = tool_input.get("command") or tool_input.get("file_path") or tool_input.get("path") or json.dumps(tool_input)
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def narrow_mode(requested: str | None, parent: str | None, is_root: bool) -> tuple[str, str | None]:
    """(mode, warning): a child's permission mode is never more permissive."""
    mode = requested or (parent if parent is not None else DEFAULT_PERMISSION_MODE)
    if parent is not None and PERMISSION_RANK[mode] > PERMISSION_RANK[parent]:
        return parent, f"permission mode {mode} lowered to the parent's {parent}"
    if mode == "bypassPermissions" and not is_root and parent != "bypassPermissions":
        return DEFAULT_PERMISSION_MODE, "bypassPermissions only where the root had it"
    return mode, None


ROUTE_SUFFIXES = (
    "ations", "ation", "ments", "ment", "ities", "ity", "ings", "ing", "ers", "er", "ance", "ence",
    "ures", "ure", "ies", "ate", "ize", "ise", "ed", "es", "ly", "s", "e",
)  # fmt: skip


def route_stem(word: str) -> str:
    """A small suffix stripper: debug, debugging and debugger share `debug`,
    optimize and optimization share `optimiz`. Crude, but the same on both sides.
    A suffix whose stem would be a stopword stays on: notes is no `not`."""
    for _ in range(2):  # again after a derivation: documentation -> document -> docu, as documents
        stripped = next(
            (
                x
                for x in ROUTE_SUFFIXES
                if word.endswith(x)
                and len(word) - len(x) >= (4 if x.startswith("ur") else 3)
                and not (x == "s" and word.endswith("ss"))
                and word[: -len(x)] not in ROUTE_STOPWORDS  # notes -> note, never not
            ),
            None,
        )  # (failure -> fail, but secure -> secur, as security)
        if stripped is None:
            break
        word = word[: -len(stripped)] + ("y" if stripped == "ies" else "")
        if stripped not in ("ations", "ation", "ities", "ity", "ance", "ence"):
            break
    if len(word) > 5 and word.endswith(("iz", "is")):
        word = word[:-2]  # optimiz(ation) -> optim, as optimize
    if len(word) > 4 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]  # debugg(ing) -> debug
    return word


def route_terms(text: str) -> list[str]:
    """Stems of the words of text; hyphens and underscores split, stopwords go."""
    words = re.findall(r"[a-z][a-z0-9]*", text.lower().replace("'", ""))
    return [route_stem(w) for w in words if len(w) >= 2 and w not in ROUTE_STOPWORDS]


def routed_text(task: str) -> str:
    """What routing reads of a task: its words, not a scripted model's inline script."""
    return task.split(" MOCK[", maxsplit=1)[0]


# "Use this agent when ...", "Use PROACTIVELY after ...", "Use it for ...": a
# description's trigger, the situations its author wants it picked for; and
# "Do not use it for ...", the ones they don't. Each runs to its sentence's end.
ROUTE_USE_WHEN = re.compile(
    r"\b(?:(do not|don'?t|never|not)\s+)?use\s+(?:(?:this|the|it|agent|subagent|proactively|immediately|only|me)\s+)*"
    r"(?:when|whenever|for|to|after|before|if|on)\b(.*?)(?:[.!?;]\s|\\n|\n|<example>|$)",
    re.IGNORECASE | re.DOTALL,
)


def use_when_terms(description: str) -> tuple[list[str], set[str]]:
    """(terms of its "use when" clauses, terms only its "do not use" clauses name) (pure)."""
    wanted: list[str] = []
    unwanted: set[str] = set()
    for match in ROUTE_USE_WHEN.finditer(description.split("<example>", 1)[0]):
        terms = route_terms(match.group(2))
        if match.group(1):
            unwanted.update(terms)
        else:
            wanted += terms
    return wanted, unwanted - set(wanted)


def route(task: str, definitions: Mapping[str, AgentDefinition]) -> dict[str, Any]:
    """Pick the definition that best matches the task (pure, deterministic).

    Each definition is a document: its name (split at hyphens), its
    description and its body's first paragraph; a word of the name also earns
    a bonus, since a name is the most deliberate summary, and so does a word
    of its "use when" clauses (the situations it is for), by less. A word
    only its "do not use for" clauses name is left out: it says where the
    agent is not wanted. Documents are ranked by BM25 over stems, so a word
    that every agent mentions counts little and long descriptions full of
    <example> blocks don't win by size. Below ROUTE_THRESHOLD the task goes to
    the default agent.
    """
    import math

    task_terms = set(route_terms(routed_text(task)))
    docs: dict[str, list[str]] = {}
    names: dict[str, set[str]] = {}
    triggers: dict[str, set[str]] = {}
    for name, d in sorted(definitions.items()):
        names[name] = set(route_terms(name))
        wanted, unwanted = use_when_terms(d.description)
        triggers[name] = set(wanted)
        doc = route_terms(name) + route_terms(d.description) + route_terms(first_paragraph(d.prompt))
        docs[name] = [t for t in doc if t not in unwanted]
    n = len(docs)
    avg_len = sum(map(len, docs.values())) / n if n else 1.0
    holders = {t: sum(1 for doc in docs.values() if t in doc) for t in task_terms}
    scored: list[tuple[float, str, list[str]]] = []
    for name, doc in docs.items():
        score, matched = 0.0, []
        for term in sorted(task_terms):
            tf = doc.count(term)
            if not tf:
                continue
            idf = math.log(1 + (n + 1) / (holders[term] + 0.5))
            score += idf * tf * (ROUTE_K1 + 1) / (tf + ROUTE_K1 * (1 - ROUTE_B + ROUTE_B * len(doc) / (avg_len or 1.0)))
            if term in names[name]:
                score += idf * ROUTE_NAME_WEIGHT  # outside BM25's saturation: a name is a deliberate summary
            if term in triggers[name]:
                score += idf * ROUTE_WHEN_WEIGHT  # and so, less, is the situation its author says to use it in
            matched.append(term)
        scored.append((round(score, 3), name, matched))
    scored.sort(key=lambda c: (-c[0], c[1]))
    chosen = scored[0][1] if scored and scored[0][0] >= ROUTE_THRESHOLD else None
    candidates = [{"name": name, "score": score, "matched": matched} for score, name, matched in scored[:3]]
    return {"chosen": chosen, "threshold": ROUTE_THRESHOLD, "candidates": candidates}


def describe_routing(routing: Mapping[str, Any]) -> str:
    scores = ", ".join(f"{c['name']} {c['score']} ({' '.join(c['matched']) or '-'})" for c in routing["candidates"][:3])
    if routing.get("by") == "model":
        chosen = routing["chosen"] or "the default agent"
        return (
            f"routed to {chosen} by the model ({routing.get('model')}): {routing.get('reason') or '(no reason given)'}; by words: {scores}"
        )
    chosen = routing["chosen"] or f"the default agent: no candidate reached the confidence threshold {routing['threshold']}"
    fallback = f"{routing['fallback']}; " if routing.get("fallback") else ""
    return f"{fallback}routed to {chosen}; top candidates: {scores}"


def _line_of(key: str, frontmatter: str) -> int:
    for n, line in enumerate(frontmatter.splitlines(), start=2):  # line 1 is the opening ---
        if re.match(rf"\s*{re.escape(key)}\s*:", line):
            return n
    return 1


def split_tool_entries(value: str) -> list[str]:
    """Claude Code's tools grammar: commas separate entries, except inside
    parentheses, so `Agent(explore, plan)` is one entry."""
    entries, depth, current = [], 0, ""
    for char in value:
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    entries.append(current)
    return [e.strip() for e in entries if e.strip()]


def _as_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return split_tool_entries(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [e for v in value for e in split_tool_entries(v)]
    raise TypeError("must be a comma-separated string or a list of strings")


YAML_BOUND_BREACHES = ("nested deeper than", "expand it past", "larger than", "inside the node it names")  # load_input's words


def _fallback_scalar(value: str) -> Any:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if value.startswith("[") and value.endswith("]"):
        return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return value


def fallback_frontmatter(frontmatter: str) -> dict[str, Any]:
    """Claude Code's reading of frontmatter that isn't YAML: `key: value` lines,
    the value being everything after the first `: ` (so `description: Use when:
    the build breaks` works), `- item` lines as a list, indented lines continuing
    the value above."""
    data: dict[str, Any] = {}
    key: str | None = None
    for line in frontmatter.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z_][\w\-]*):(?: (.*))?\s*", line)
        if m and not line[0].isspace():
            key, value = m.group(1), (m.group(2) or "").strip()
            data[key] = _fallback_scalar(value) if value else None
        elif key is not None and stripped.startswith("- "):
            items = data[key] if isinstance(data[key], list) else []
            data[key] = [*items, str(_fallback_scalar(stripped[2:].strip()))]
        elif key is not None and isinstance(data[key], str | None):
            data[key] = f"{data[key] or ''} {stripped}".strip()
    return data


def first_paragraph(text: str) -> str:
    """The body's first paragraph that isn't a heading: what routing reads of the prompt."""
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        if " ".join(lines).strip():
            return " ".join(line.strip() for line in lines)
    return ""


def tool_entry(entry: str) -> tuple[str, str | None]:
    """(canonical tool, specifier) of one tools entry such as Agent(explore, plan)."""
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_\-]*)(?:\((.*)\))?", entry.strip(), flags=re.DOTALL)
    if m is None:
        return entry.strip(), None
    return canonical_tool(m.group(1)), (m.group(2).strip() if m.group(2) is not None else None)


# Claude Code's own reading of an agent file's frontmatter: from the opening
# line to the first '---' anywhere, even inside a value or a longer rule of dashes.
CLAUDE_FRONTMATTER = re.compile(r"---\s*\n([\s\S]*?)---\s*\n?")


def parse_definition(
    text: str, path: str, source: str, known_tools: frozenset[str] = KNOWN_TOOLS
) -> tuple[AgentDefinition | None, list[Problem]]:
    """An agent file's definition and what is wrong with it (pure).

    Read as Claude Code reads it: YAML frontmatter, or when that fails the
    `key: value` fallback; fields spawn.py doesn't know are warnings.
    """
    stem = Path(path).stem
    problems: list[Problem] = []
    text = text.lstrip("\ufeff")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        # Claude Code skips such files (a collection's README.md, say): a warning, not an error.
        return None, [Problem(path, 1, "no frontmatter (the file must start with a line '---'): not an agent, skipped", "warning")]
    closed = CLAUDE_FRONTMATTER.match(text) if text.find("---", 3) >= 0 else None
    if closed is None:
        return None, [Problem(path, 1, "the frontmatter is not closed by a line '---'")]
    closing_line = closed.group(1).count("\n") + 2
    frontmatter, body = closed.group(1).removesuffix("\n"), text[closed.end() :]
    if lines[closing_line - 1].strip().strip("-"):
        # Claude Code ends the frontmatter at the first '---' even inside a value;
        # the fields after it are prompt to it, so they are to spawn.py.
        problems.append(
            Problem(
                path,
                closing_line,
                "a '---' inside this line ends the frontmatter, as Claude Code reads it: the lines below are the prompt",
                "warning",
            )
        )

    def problem(key: str, message: str, severity: str = "error") -> None:
        problems.append(Problem(path, _line_of(key, frontmatter), message, severity))

    try:
        data = load_input(frontmatter, path, "YAML") or {}
    except InputError as exc:
        line = exc.line + 1 if exc.line is not None else 1  # after the opening '---'
        reason = exc.why.removeprefix("not valid YAML: ")
        # Past a bound (depth, size, alias expansion) the file is hostile or broken, not hand-written
        # YAML that Claude Code's fallback reads as meant: an error, whatever the fallback would find.
        data = {} if any(bound in reason for bound in YAML_BOUND_BREACHES) else fallback_frontmatter(frontmatter)
        if not data:
            return None, [Problem(path, line, f"bad YAML: {reason}")]
        problems.append(Problem(path, line, f"bad YAML ({reason}); read with Claude Code's 'key: value' fallback", "warning"))
    if not isinstance(data, dict):
        return None, [Problem(path, 2, "the frontmatter must be a mapping of fields")]
    d = AgentDefinition(name=str(data.get("name") or stem), path=path, source=source, prompt=body.strip())

    for key in data:
        if key not in CLAUDE_AGENT_FIELDS | SPAWN_AGENT_FIELDS:
            problem(str(key), f"unknown field {key!r} (ignored)", "warning")
    if d.name != stem:
        problem("name", f"name {d.name!r} differs from the file name {stem!r}; Claude Code and spawn.py use the name", "warning")
    if not isinstance(data.get("description", ""), str) or not data.get("description"):
        problem("description", "description is missing: routing and 'agents list' need it")
    d.description = str(data.get("description") or "")
    _parse_tool_lists(data, d, problem, known_tools)
    model = data.get("model")
    if isinstance(model, str) and model.strip():
        d.model = model.strip()
    elif model is not None:
        # Claude Code takes a model only from a non-empty string, and runs the agent without one otherwise.
        problem("model", f"model must be a name like sonnet or a model id, got {model!r}; ignored, as Claude Code ignores it", "warning")
    mode = data.get("permissionMode")
    if mode is not None:
        if mode not in PERMISSION_RANK:
            problem("permissionMode", f"unknown permissionMode {mode!r}; use one of {', '.join(PERMISSION_MODES)}")
        else:
            d.permission_mode = str(mode)
    _parse_mcp_servers(data, d, problem)
    _parse_schema_field(data, d, problem)
    for key, attr, maximum, integer, zero_ok in DEFINITION_NUMBERS:
        value = data.get(key)
        if value is None:
            continue
        why = number_problem(key, value, maximum=maximum, integer=integer, zero_ok=zero_ok)
        if why is not None:
            problem(key, why)
        else:
            setattr(d, attr, int(value) if integer else float(value))
    _parse_claude_fields(data, d, problem)
    parse_node_fields(data, d, problem)
    _parse_permissions(data, d, problem)
    return d, problems


def _parse_tool_lists(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None], known_tools: frozenset[str]) -> None:
    """tools, disallowedTools and skills: lists, the tools checked against the known ones."""
    for key, attr in (("tools", "tools"), ("disallowedTools", "disallowed_tools"), ("skills", "skills")):
        try:
            value = _as_list(data.get(key))
        except TypeError as exc:
            problem(key, f"{key} {exc}")
            continue
        if value == ["*"] and key == "tools":
            value = None  # Claude Code's "all tools": here, as without the field, it inherits
        if value is not None and key != "skills":
            names: list[str] = []
            for entry in value:
                tool, spec = tool_entry(entry)
                if tool not in known_tools and not tool.startswith("mcp__"):
                    problem(key, f"unknown tool {tool} (kept: the CLI may know it)", "warning")
                names.append(tool)
                if spec is not None and key == "tools":
                    # Agent(explore, plan): the tool, narrowed to those specifiers.
                    for one in split_tool_entries(spec) if tool == "Agent" else [spec]:
                        d.permissions.allow.append(Rule(tool, one, f"{tool}({one})"))
            value = list(dict.fromkeys(names))
        if value is not None and key == "skills":
            bad = [v for v in value if not re.fullmatch(r"[A-Za-z0-9][\w.:\-]*", v)]
            if bad:
                # The SDK refuses such names outright; drop them rather than fail the run.
                problem(key, f"skill names {', '.join(map(repr, bad))} are not skill directory names; ignored", "warning")
                value = [v for v in value if v not in bad]
        if value is not None:
            setattr(d, attr, value)


def _parse_mcp_servers(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """mcpServers, in Claude Code's mapping or list form."""
    servers = data.get("mcpServers")
    if servers is not None:
        if isinstance(servers, list):
            # Claude Code's list form: names of servers configured elsewhere, or {name: config} items.
            d.mcp_server_refs = [str(item) for item in servers if not isinstance(item, dict)]
            servers = {k: v for item in servers if isinstance(item, dict) for k, v in item.items()}
        if isinstance(servers, dict) and all(isinstance(v, dict) for v in servers.values()):
            d.mcp_servers = {str(k): v for k, v in servers.items()}
            for server_name, server in servers.items():
                kind = server.get("type", "stdio")
                if kind not in MCP_SERVER_TYPES:
                    problem("mcpServers", f"mcpServers.{server_name}: unknown type {kind!r}; use one of {', '.join(MCP_SERVER_TYPES)}")
                elif kind in ("http", "sse") and not isinstance(server.get("url"), str):
                    problem("mcpServers", f"mcpServers.{server_name}: a {kind} server needs a url")
                elif kind == "stdio" and not isinstance(server.get("command"), str):
                    problem("mcpServers", f"mcpServers.{server_name}: a stdio server needs a command")
        else:
            problem("mcpServers", "mcpServers must map server names to {command, args, env} or {type, url} objects")


def _parse_schema_field(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """schema: a NAME from schemas/ (or built in), a path, or inline JSON."""
    schema = data.get("schema")
    if schema is not None:
        if not isinstance(schema, str):
            problem("schema", "schema must be a schema NAME from schemas/ or a path")
        else:
            d.schema = schema
            if re.fullmatch(r"[A-Za-z0-9_.\-]+", schema) and not schema.endswith(".json"):
                if not (SCHEMA_DIR / f"{schema}.json").is_file() and f"{schema}.json" not in builtin_files("schemas"):
                    problem("schema", f"schema {schema!r} is neither in {SCHEMA_DIR} nor built in")
            elif not schema.lstrip().startswith(("{", "[")) and not Path(schema).expanduser().is_file():
                problem("schema", f"schema file {schema} does not exist")


def _parse_permissions(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """permissions: allow, deny and ask lists of rules."""
    perms = data.get("permissions")
    if perms is not None:
        if not isinstance(perms, dict):
            problem("permissions", "permissions must be a mapping with allow, deny and ask lists")
        else:
            for kind in perms:
                if kind not in PERMISSION_KINDS:
                    problem(str(kind), f"unknown permissions list {kind!r}; use allow, deny or ask")
            for kind in PERMISSION_KINDS:
                for rule_text in _as_list(perms.get(kind)) or []:
                    try:
                        getattr(d.permissions, kind).append(parse_rule(rule_text))
                    except RuleSyntaxError as exc:
                        problem(kind, exc.message)


def _parse_claude_fields(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """The fields Claude Code added for subagents; a bad value is ignored with a
    warning, as Claude Code ignores it, so the file still loads. Its numbers
    (maxTurns, autoCompactWindow) are checked with spawn.py's own, in
    DEFINITION_NUMBERS."""
    effort = data.get("effort")
    if effort is not None:
        if effort in EFFORT_LEVELS or (isinstance(effort, int) and not isinstance(effort, bool)):
            d.effort = effort
        else:
            problem("effort", f"effort must be one of {', '.join(EFFORT_LEVELS)}, got {effort!r}; ignored", "warning")
    for key, attr, choices in (("isolation", "isolation", ("worktree",)), ("memory", "memory", MEMORY_SCOPES)):
        value = data.get(key)
        if value is None:
            continue
        if value in choices:
            setattr(d, attr, value)
        else:
            problem(key, f"{key} must be {' or '.join(choices)}, got {value!r}; ignored", "warning")
    for key, attr in (("background", "background"), ("omitClaudeMd", "omit_claude_md")):
        value = data.get(key)
        if value is not None:
            if isinstance(value, bool):
                setattr(d, attr, value)
            else:
                problem(key, f"{key} must be true or false, got {value!r}; ignored", "warning")
    for key, attr in (("initialPrompt", "initial_prompt"), ("color", "color")):
        value = data.get(key)
        if value is not None:
            setattr(d, attr, str(value))
    hooks = data.get("hooks")
    if hooks is not None:
        if isinstance(hooks, dict) and all(isinstance(v, list) for v in hooks.values()):
            d.hooks = {str(k): v for k, v in hooks.items()}
        else:
            problem("hooks", "hooks must map events (PreToolUse, ...) to lists of matchers, as in settings.json; ignored", "warning")


def remember_cli_tools(init: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Cache the tool names a CLI's init message lists, one file per CLI version,
    so that lint knows that CLI's tools offline. An init message lists only the
    tools that run enabled, so the file keeps the union of every run's. Best
    effort: a cache that can't be written only costs warnings later."""
    version, tools = init.get("claude_code_version"), init.get("tools")
    if not isinstance(version, str) or not isinstance(tools, list) or not re.fullmatch(r"[\w.\-]+", version):
        return
    names = {canonical_tool(t) for t in tools if isinstance(t, str) and not t.startswith("mcp__")}
    path = cache_dir(environ) / f"cli-tools-{version}.json"
    old: set[str] = set()
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):  # absent or unreadable: start afresh
        old = {t for t in parse_json(path.read_text()).get("tools", []) if isinstance(t, str)}
    if names <= old:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Readers see the old list or the new one, never half.
        write_file_atomic(path, (json.dumps({"claude_code_version": version, "tools": sorted(names | old)}) + "\n").encode())


def known_tools(environ: Mapping[str, str]) -> frozenset[str]:
    """The seed list plus every tool a CLI on this machine has reported."""
    names = set(KNOWN_TOOLS)
    with contextlib.suppress(OSError):
        for path in sorted(cache_dir(environ).glob("cli-tools-*.json")):
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                names |= {t for t in parse_json(path.read_text()).get("tools", []) if isinstance(t, str)}
    return frozenset(names)


# The default agents spawn.py carries (the embedded module), listed with this source.
BUILTIN_AGENTS = ".claude/agents"
BUILTIN_SOURCE = "built-in"


def agent_dirs_for(cwd: Path, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where definitions live: the project's .claude/agents (nearest upwards), then the user's."""
    found: list[tuple[Path, str]] = []
    for folder in (cwd, *cwd.parents):
        candidate = folder / ".claude" / "agents"
        if candidate.is_dir():
            found.append((candidate, "project"))
            break
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    user = home / ".claude" / "agents"
    if user.is_dir() and all(user.resolve() != p.resolve() for p, _ in found):
        found.append((user, "user"))
    return found


def skill_file(name: str, project: Path | None, environ: Mapping[str, str]) -> Path | None:
    """Where Claude Code finds skill NAME: the project's .claude/skills, then the user's."""
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    for root in (project, home):
        if root is not None and (root / ".claude" / "skills" / name / "SKILL.md").is_file():
            return root / ".claude" / "skills" / name / "SKILL.md"
    return None


def project_of(definition_path: str) -> Path:
    """The project a definition file belongs to: the folder holding its .claude."""
    folder = Path(definition_path).resolve().parent
    while folder.name != ".claude" and folder != folder.parent:
        folder = folder.parent
    return folder.parent


def resolve_mcp_refs(d: AgentDefinition, environ: Mapping[str, str]) -> list[str]:
    """Fill in the servers a definition names but doesn't configure, from where
    Claude Code configures them: the project's .mcp.json, then ~/.claude.json.
    Returns the names found nowhere (their tools are then unavailable)."""
    home = Path(environ.get("HOME") or Path.home()).expanduser()
    missing = []
    for name in d.mcp_server_refs:
        for config_file in (project_of(d.path) / ".mcp.json", home / ".claude.json"):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                config = parse_json(read_input(config_file)).get("mcpServers", {}).get(name)
                if isinstance(config, dict):
                    d.mcp_servers.setdefault(name, config)
                    break
        else:
            missing.append(name)
    return missing


def load_definitions(cwd: Path, environ: Mapping[str, str]) -> tuple[dict[str, AgentDefinition], list[Problem]]:
    """Every definition by name (the project's win over the user's, the user's over
    the built-in ones), and the problems found."""
    definitions: dict[str, AgentDefinition] = {}
    problems: list[Problem] = []
    tools = known_tools(environ)
    for folder, source in agent_dirs_for(cwd, environ):
        seen_here: dict[str, str] = {}
        for path in sorted(folder.rglob("*.md")):  # subfolders too, as Claude Code finds them
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(Problem(str(path), 1, f"unreadable: {exc}"))
                continue
            d, found = parse_definition(text, str(path), source, tools)
            problems += found
            if d is None:
                continue
            for name in resolve_mcp_refs(d, environ):
                problems.append(Problem(str(path), 1, f"MCP server {name!r} is in neither .mcp.json nor ~/.claude.json", "warning"))
            for name in d.skills or []:
                if skill_file(name, project_of(d.path), environ) is None:
                    problems.append(Problem(str(path), 1, f"skill {name!r} is in no .claude/skills/{name}/SKILL.md", "warning"))
            if d.name in seen_here:
                problems.append(Problem(str(path), 1, f"duplicate agent name {d.name!r} (also {seen_here[d.name]})"))
                continue
            seen_here[d.name] = str(path)
            definitions.setdefault(d.name, d)
    for name, text in builtin_files(BUILTIN_AGENTS).items():
        if Path(name).stem not in definitions:  # a file's definition overrides a built-in one
            d, found = parse_definition(text, builtin_label(f"{BUILTIN_AGENTS}/{name}"), BUILTIN_SOURCE, tools)
            problems += found
            if d is not None:
                definitions.setdefault(d.name, d)
    return definitions, problems


AGENT_TEMPLATE = """\
---
# Claude Code's fields (this file works in Claude Code too).
name: {name}
# One sentence on WHEN to use this agent: `--agent auto` routes tasks by it.
description: Use for ... (distinctive words that match the tasks it should get)
# Tools it sees, comma-separated; a spawn can narrow them, never widen.
tools: Read, Grep, Glob
# sonnet, opus, haiku, a model id, or inherit (the parent's): names Claude Code
# knows too. spawn.py also takes its tiers here (high-tier, medium-tier, low-tier).
model: sonnet
# plan, dontAsk (spawn.py's default), default, acceptEdits, bypassPermissions.
# permissionMode: dontAsk
# maxTurns: 20              # its turn limit
# effort: medium            # low, medium, high, xhigh, max
# background: true          # start in the background unless --no-background
# isolation: worktree       # work in a fresh git worktree, kept only if changed
# memory: project           # user, project or local: notes kept across runs
# mcpServers:
#   docs:
#     command: python
#     args: [docs_server.py]

# spawn.py's additions.
# schema: findings          # schemas/NAME.json, or a path
# max_depth: 1              # deepest depth below the root its subtree may reach
# timeout: 600              # seconds
# max_budget_usd: 0.50
# permissions:              # Claude Code's rule syntax: deny, then ask, then allow
#   allow: ["Bash(git diff:*)"]
#   deny: ["Read(**/.env*)"]
#   ask: ["Bash(git push:*)"]
---
You are the {name} agent. Describe its job, its method, and what a good answer
contains. When an output schema is set, answer with the StructuredOutput tool.
"""


# What a node can be; executors.EXECUTORS has one class for each, in this order.
NODE_KINDS = ("claude", "a2a", "command")
A2A_CARD_PATH = "/.well-known/agent-card.json"


@dataclass(frozen=True)
class Node:
    """What runs a node: its kind and, for a2a and command, where it lives."""

    kind: str
    endpoint: str | None = None
    """a2a: the agent card's URL; command: the command line."""


@dataclass
class NodeResult:
    """What a node of another kind than claude came back with (RunState.node_result)."""

    status: Status
    reason: str
    output: Any = None
    text: str | None = None
    cost_usd: float | None = None
    """As the node reported it; None (unknown) otherwise."""


class NodeReferenceError(UsageError):
    def __init__(self, reference: str, why: str) -> None:
        super().__init__(f"--agent {reference}: {why}")


def parse_reference(value: str | None) -> Node | None:
    """The node an --agent value names directly, or None for a definition NAME (pure).

    a2a:URL (the agent's base URL, or its card's), an http(s) URL of an agent
    card, or command:EXE [ARGS].
    """
    if not value:
        return None
    if value.startswith("command:"):
        command = value.removeprefix("command:").strip()
        command_argv(command, value)
        return Node("command", command)
    if value.startswith("a2a:"):
        return Node("a2a", a2a_card_url(value.removeprefix("a2a:"), value))
    if re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://", value):
        from urllib.parse import urlsplit

        if not urlsplit(value).path.endswith(A2A_CARD_PATH):
            raise NodeReferenceError(
                value, f"a URL must be an A2A agent card (...{A2A_CARD_PATH}); or write a2a:URL for an agent's base URL"
            )
        return Node("a2a", a2a_card_url(value, value))
    return None


def a2a_card_url(url: str, reference: str) -> str:
    """The agent card's URL: URL itself when it names a .json file, else URL + the well-known path (pure)."""
    from urllib.parse import urlsplit

    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NodeReferenceError(reference, "an A2A agent is an http(s) URL, e.g. a2a:https://host/path")
    return url if parts.path.endswith(".json") else url.rstrip("/") + A2A_CARD_PATH


def command_argv(command: str, reference: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise NodeReferenceError(reference, f"can't split the command line ({exc}); check its quoting") from None
    if not argv:
        raise NodeReferenceError(reference, "give the executable, e.g. command:/path/to/exe")
    return argv


def parse_node_fields(data: Mapping[str, Any], d: AgentDefinition, problem: Callable[..., None]) -> None:
    """A definition's kind, with its url (a2a) or command (command)."""
    kind = data.get("kind")
    if kind is None:
        for key in ("url", "command"):
            if key in data:
                problem(key, f"{key} needs 'kind: {'a2a' if key == 'url' else 'command'}'; ignored", "warning")
        return
    if kind not in NODE_KINDS:
        problem("kind", f"kind must be one of {', '.join(NODE_KINDS)}, got {kind!r}")
        d.kind = str(kind)  # an agent that can't run as what it says is not run as claude
        return
    d.kind = str(kind)
    if d.kind == "claude":
        return
    key = "url" if d.kind == "a2a" else "command"
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        problem("kind", f"kind {kind} needs {key}: {'the agent URL' if key == 'url' else 'the executable and its arguments'}")
        return
    try:
        d.endpoint = a2a_card_url(value, value) if key == "url" else " ".join(map(shlex.quote, command_argv(value, value)))
    except NodeReferenceError as exc:
        problem(key, exc.message.removeprefix(f"--agent {value}: "))


def node_of_definition(definition: AgentDefinition | None) -> Node:
    if definition is None or definition.kind == "claude":
        return Node("claude")
    if definition.kind not in NODE_KINDS or definition.endpoint is None:
        raise UsageError(f"agent definition {definition.path} has a bad kind or no url/command; fix it (see 'spawn.py agents lint')")
    return Node(definition.kind, definition.endpoint)
