"""What a sandboxed ancestor may have written: the inputs a child must not run code from.

A sandboxed agent's Bash writes its working directory (less its .claude/),
its scratch/ and its drop box. Its children run outside its sandbox: a CLI
started there runs, as the user, whatever its settings, its definition or its
skills say (hooks, helpers, MCP servers, plugins). So for any agent with a
sandboxed ancestor, each such input is taken only from a place no sandboxed
ancestor can write; one that lies in such a place is left out, or, where the
agent can't run as asked without it (a definition's MCP servers and hooks),
the spawn is refused.

Which places are writable is a question of paths, never of what the files
hold now: the answer can't change between the check and the CLI's start.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.constants import REFUSED_DIR, REQUESTS_DIR, SCRATCH_DIR
from ..core.errors import SpawnError
from ..core.pure import claude_config_dir
from ..session.protocol import AGENTS_DIR, cache_dir, load_meta
from .agents import AgentDefinition, project_of

ANCESTRY_MAX = 256  # parent links followed at most: a cycle in forged records ends here
SETTING_SOURCES = ("user", "project", "local")  # the CLI's --setting-sources, all of them


@dataclass(frozen=True)
class SandboxWrites:
    """Where one sandboxed agent's Bash may write."""

    agent_id: str
    roots: tuple[str, ...]
    """Real paths it may write below: its cwd, its scratch/, its drop boxes."""
    held: tuple[str, ...]
    """Real paths below those that its sandbox holds read-only (its cwd's .claude/)."""


def below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def sandboxed_ancestors(session: Path | str | None, parent_id: str | None) -> list[SandboxWrites]:
    """Where each sandboxed agent from parent_id up to the root may write, from the session's records.

    The records are the runners', read-only to every sandboxed agent: a
    sandboxed agent can't hide itself from this walk. A record that can't be
    read ends the walk, as its parent is then unknown.
    """
    found: list[SandboxWrites] = []
    seen: set[str] = set()
    while session is not None and parent_id and parent_id not in seen and len(seen) < ANCESTRY_MAX:
        seen.add(parent_id)
        agent_dir = Path(session) / AGENTS_DIR / parent_id
        try:
            meta = load_meta(agent_dir)
        except (OSError, SpawnError, ValueError):
            break
        if meta.sandbox in ("on", "inherited"):
            cwd = os.path.realpath(meta.cwd)
            boxes = [Path(session) / REQUESTS_DIR / meta.id, Path(session) / REFUSED_DIR / meta.id, agent_dir / SCRATCH_DIR]
            found.append(SandboxWrites(meta.id, (cwd, *(os.path.realpath(b) for b in boxes)), (os.path.join(cwd, ".claude"),)))
        parent_id = meta.parent_id
    return found


def writer_of(path: str | Path, writes: Sequence[SandboxWrites]) -> str | None:
    """The id of a sandboxed ancestor that can write path (following its links as they are now), or None."""
    real = os.path.realpath(path)
    for w in writes:
        if any(below(real, root) for root in w.roots) and not any(below(real, held) for held in w.held):
            return w.agent_id
    return None


def cwd_refusal(cwd: str, writes: Sequence[SandboxWrites]) -> str | None:
    """Why an agent below sandboxed ones can't work in cwd (a real path), or None.

    A folder strictly below a sandboxed agent's own lies in one it writes:
    it can rename it and put a link out in its place at any moment of the
    child's life, and the child's CLI and its sandbox name the folder by
    path. Its own folder it can't rename (its parent is read-only to it).
    """
    for w in writes:
        for root in w.roots:
            if cwd != root and below(cwd, root):
                return (
                    f"working directory {cwd} lies inside sandboxed agent {w.agent_id}'s folder {root}, which it could swap "
                    f"for a link out while the child works there; a sandboxed agent's children start in its own folder: "
                    f"spawn from {root} and let the child cd"
                )
    return None


def untrusted_sources(cwd: str, environ: Mapping[str, str], writes: Sequence[SandboxWrites]) -> dict[str, str]:
    """The CLI's setting sources a sandboxed ancestor can write, each with why (pure but for realpath).

    user: the config directory (settings, plugins, skills). project and local:
    the .claude/ of the cwd or of any folder above it, wherever the CLI may
    look for a project's settings and skills. (.mcp.json is never read: every
    CLI runs with --strict-mcp-config.)
    """
    if not writes:
        return {}
    out: dict[str, str] = {}
    config = claude_config_dir(environ)
    if (who := writer_of(config, writes)) is not None:
        out["user"] = f"{config} is writable by sandboxed agent {who}"
    for folder in (Path(cwd), *Path(cwd).parents):
        if (who := writer_of(folder / ".claude", writes)) is not None:
            out["project"] = out["local"] = f"{folder / '.claude'} is writable by sandboxed agent {who}"
            break
    return out


def trusted_sources(asked: Sequence[str] | None, untrusted: Mapping[str, str]) -> list[str] | None:
    """The setting sources a CLI may load: those asked (None: the CLI's default, all of them) less the untrusted (pure)."""
    if not untrusted:
        return None if asked is None else list(asked)
    return [s for s in (SETTING_SOURCES if asked is None else asked) if s not in untrusted]


def definition_refusal(definition: AgentDefinition, environ: Mapping[str, str], writes: Sequence[SandboxWrites]) -> str | None:
    """Why a definition's commands can't run for an agent below a sandboxed one, or None.

    Its hooks and MCP servers are commands the CLI runs outside any sandbox:
    they are taken only from a file no sandboxed ancestor can write, and
    servers it names but doesn't configure only from config files none can
    write. Its other fields only narrow, and may come from anywhere.
    """
    if not writes or not (definition.hooks or definition.mcp_servers or definition.mcp_server_refs):
        return None
    sources = [definition.path]
    if definition.mcp_server_refs:
        home = Path(environ.get("HOME") or Path.home()).expanduser()
        sources += [str(project_of(definition.path) / ".mcp.json"), str(home / ".claude.json")]
    for source in sources:
        if (who := writer_of(source, writes)) is not None:
            return (
                f"definition {definition.name}: its hooks or MCP servers come from {source}, which sandboxed agent {who} "
                "can write, and would run outside its sandbox; keep such definitions where no sandboxed agent writes "
                "(~/.claude/agents, or the project's own .claude/agents above the agents' working directories)"
            )
    return None


def uv_cache_dir(environ: Mapping[str, str], cwd: str) -> str:
    """uv's cache, as uv finds it: $UV_CACHE_DIR (a relative one from the cwd uv runs in), else $XDG_CACHE_HOME/uv, else ~/.cache/uv."""
    if environ.get("UV_CACHE_DIR"):
        return os.path.join(cwd, os.path.expanduser(environ["UV_CACHE_DIR"]))
    home = environ.get("HOME") or str(Path.home())
    return os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "uv")


def code_folders(environ: Mapping[str, str], cwd: str) -> list[str]:
    """What every process of the tree, and the user's next `uv run`, runs code from: read-only in every sandbox, wherever it lies.

    uv's cache (the runner's and the agent's cwd's, for a relative
    $UV_CACHE_DIR: environments of `uv run` live there), the tree's Python
    (its prefix, where site-packages and the fast-start .pth are, and its
    base interpreter's) and the project's .venv. An agent that could write
    any of them would run its code outside its sandbox at the next start of
    an interpreter there. (spawn.py's own cache is held by the caller.)
    """
    import sysconfig

    folders = {uv_cache_dir(environ, os.getcwd()), uv_cache_dir(environ, cwd), os.path.join(cwd, ".venv")}
    # A prefix's code, not the prefix whole: a folder beside its bin/ and lib/
    # (nox's tmp/, where CI's tests run their agents) is no interpreter's.
    for prefix in {sys.prefix, sys.base_prefix}:
        folders |= {os.path.join(prefix, name) for name in ("bin", "lib", "lib64", "include", "pyvenv.cfg")}
    folders |= {sysconfig.get_path(name) for name in ("purelib", "platlib", "scripts")}
    return sorted({os.path.realpath(f) for f in folders})


def sandbox_uv_cache(agent_id: str, environ: Mapping[str, str]) -> dict[str, str]:
    """A sandboxed Bash's own uv cache: uv there works, and writes nothing a process outside the sandbox runs.

    In the CLI's sandbox temp folder ($CLAUDE_CODE_TMPDIR, else
    /tmp/claude-UID), which its Bash may write: the agent's scratch/ lies in
    its agent directory, which the sandbox holds read-only whole.
    """
    tmp = environ.get("CLAUDE_CODE_TMPDIR") or os.path.join(environ.get("TMPDIR") or "/tmp", f"claude-{os.getuid()}")
    return {"UV_CACHE_DIR": os.path.join(tmp, f"uv-cache-{agent_id}")}


# ------------------------------------------------------- paths resolved once --

# A path a sandboxed agent can rename parts of is resolved once, into a
# descriptor, and used by that descriptor from then on: a check of the path
# and a later use of it would see two different folders if the agent swapped
# one for a link in between. openat2(2) does the resolving in the kernel
# (Linux 5.6+; Python 3.11 has no os.openat2, so its syscall is called);
# elsewhere a walk one component at a time with O_NOFOLLOW, which follows no
# link at all.
SYS_OPENAT2 = 437  # the same number on x86_64 and arm64 (the generic table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
AT_FDCWD = -100


def openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int | None:
    """openat2(2)'s descriptor, OSError for its refusal, or None where the kernel (or a seccomp filter) has no openat2."""
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))

    libc = ctypes.CDLL(None, use_errno=True)
    how = OpenHow(flags, 0, resolve)
    fd = int(libc.syscall(SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)))
    if fd >= 0:
        return fd
    errno = ctypes.get_errno()
    if errno in (38, 1):  # ENOSYS, EPERM (a seccomp filter): no openat2 here
        return None
    raise OSError(errno, os.strerror(errno), path)


def walk_nofollow(dir_fd: int, path: str) -> int:
    """An O_PATH descriptor of the folder path below dir_fd, opened one component at a time, following no link and never '..'."""
    fd = os.dup(dir_fd) if dir_fd != AT_FDCWD else os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    if path.startswith("/"):
        os.close(fd)
        fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p not in ("", ".")]:
            if part == "..":
                raise OSError(18, "a '..' is not followed here", path)  # EXDEV, as openat2's RESOLVE_BENEATH says it
            child = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_folder_beneath(root: str, path: str) -> int:
    """An O_PATH descriptor of the folder path (absolute, at or below root), resolved beneath root: OSError if it leads out.

    Links that stay below root are followed where openat2 is; the fallback follows none.
    """
    relative = os.path.relpath(path, root)
    if relative == ".." or relative.startswith("../") or os.path.isabs(relative):
        raise OSError(18, f"not below {root}", path)
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        fd = openat2(root_fd, relative, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        return fd if fd is not None else walk_nofollow(root_fd, relative)
    finally:
        os.close(root_fd)


def open_real_folder(path: str) -> int:
    """An O_PATH descriptor of the folder at path, which must be a real path (no link in it, as admission recorded it): OSError if not."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    fd = openat2(AT_FDCWD, path, flags, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    return fd if fd is not None else walk_nofollow(AT_FDCWD, path)


def fd_path(fd: int) -> str:
    """What a process started with cwd=fd_path(fd) gets as its cwd: the folder fd holds, whatever its path names by then.

    /proc/self/fd/N is resolved in the child after its fork, while it
    still holds the parent's descriptors: so no pass_fds, which would leave a
    descriptor opened outside a sandbox in the hands of what runs inside it.
    """
    return f"/proc/self/fd/{fd}"


def server_secrets(environ: Mapping[str, str]) -> list[str]:
    """What no sandboxed agent may read: the A2A server's token files (CACHE/a2a, made now so the sandbox can
    hide them), and the user's claude.ai login (the config folder's .credentials.json), where there is one.

    With the token, an agent the server serves could call it as the person
    does: answer its own ask. With the login, it could call the model as the
    user, past the tree's gateway. Its own CLI runs outside the sandbox and
    reads what it needs there.
    """
    folder = cache_dir(environ) / "a2a"
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    login = claude_config_dir(environ) / ".credentials.json"
    return [os.path.realpath(p) for p, there in ((folder, folder.is_dir()), (login, login.is_file())) if there]
