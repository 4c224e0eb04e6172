"""Settings: the environment, read once at an edge and frozen, with its typed values.

An edge is where a process starts being spawn.py: main(), a runner's start
(a forked agent's too: the fork server hands it its own environment), the
Python API's entry. It reads os.environ once into a Settings, and what runs
below takes that object: a value can't change under a running agent, and a
test hands a runner the environment it wants without touching os.environ.

A Settings is also a read-only Mapping of the whole environment, so the many
helpers that take `environ` (and build a child's environment from it) take it
as it is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .constants import ASK_TIMEOUT_S, ENV_ASK_TIMEOUT, ENV_HEARTBEAT, ENV_LOG_MAX, ENV_WAIT_POLL, HEARTBEAT_S, LOG_MAX_BYTES
from .pure import float_or_none


def ask_timeout(environ: Mapping[str, str]) -> float:
    """Seconds an unanswered ask waits before it is a no: SPAWN_ASK_TIMEOUT_S, else ASK_TIMEOUT_S."""
    value = float_or_none(environ.get(ENV_ASK_TIMEOUT))
    return value if value is not None and value > 0 else ASK_TIMEOUT_S


def heartbeat_interval(environ: Mapping[str, str]) -> float:
    """Seconds between an agent's heartbeats: SPAWN_HEARTBEAT_S, else HEARTBEAT_S."""
    value = float_or_none(environ.get(ENV_HEARTBEAT))
    return value if value is not None and value > 0 else HEARTBEAT_S


def log_max_bytes(environ: Mapping[str, str]) -> int:
    """An agent log's cap: SPAWN_TRANSCRIPT_MAX_BYTES, never above LOG_MAX_BYTES."""
    value = float_or_none(environ.get(ENV_LOG_MAX))
    return int(min(value, LOG_MAX_BYTES)) if value is not None and value >= 1 else LOG_MAX_BYTES


def wait_polls(environ: Mapping[str, str]) -> bool:
    """Whether wait must poll outcomes, not watch them: the user says inotify can't see the writers."""
    return environ.get(ENV_WAIT_POLL, "") not in ("", "0")


@dataclass(frozen=True, eq=False)
class Settings(Mapping[str, str]):
    """The environment one edge read, frozen, with the values the runner uses typed."""

    environ: Mapping[str, str]
    """All of it, read-only: what a child's environment starts from."""
    home: str
    ask_timeout_s: float
    heartbeat_s: float
    log_max_bytes: int
    wait_polls: bool

    @classmethod
    def read(cls, source: Mapping[str, str] | None = None) -> Settings:
        """A snapshot of source (os.environ when None): the one read of it."""
        environ = MappingProxyType(dict(os.environ if source is None else source))
        return cls(
            environ=environ,
            home=environ.get("HOME") or str(Path.home()),
            ask_timeout_s=ask_timeout(environ),
            heartbeat_s=heartbeat_interval(environ),
            log_max_bytes=log_max_bytes(environ),
            wait_polls=wait_polls(environ),
        )

    def without(self, names: Iterable[str]) -> Settings:
        """The same read, less some variables (the real credential, once the tree's gateway holds it)."""
        dropped = set(names)
        return Settings.read({k: v for k, v in self.environ.items() if k not in dropped})

    def __getitem__(self, key: str) -> str:
        return self.environ[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.environ)

    def __len__(self) -> int:
        return len(self.environ)


def settings_of(environ: Mapping[str, str]) -> Settings:
    """environ as Settings: itself when an edge already read it, else read now."""
    return environ if isinstance(environ, Settings) else Settings.read(environ)
