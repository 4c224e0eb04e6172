"""main(): the one place where exceptions become exit codes, and the dispatch of every verb."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.machinery
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from ..core.errors import ExitCode, SpawnError, UnknownVerbError
from ..core.settings import Settings
from ..policy.gateway import serve_gateway
from ..run.broker import brokered
from ..supervise.fast_start import install_fast_start
from .commands import (
    build_verb_parser,
    cmd_agents,
    cmd_answer,
    cmd_background_runner,
    cmd_guard,
    cmd_kill,
    cmd_reap,
    cmd_run,
    cmd_status,
    cmd_wait,
)
from .dag import cmd_dag, cmd_estimate, cmd_state, cmd_workflow
from .options import VERBS, WORKFLOW_VERBS
from .steering_verbs import STEERING_VERBS, add_steering_arguments, cmd_budget, cmd_send

# --------------------------------------------------------------------- main --


def main(argv: Sequence[str] | None = None) -> int:
    """The one place where exceptions become exit codes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = Settings.read()  # the one read of the environment: everything below takes this
    traceback = "--traceback" in argv
    try:
        # Inside a sandboxed spawner, its runner runs spawns and kills (the broker).
        if (code := brokered(argv, VERBS, environ)) is not None:
            return code
        if argv and argv[0] in VERBS:
            verb = argv[0]
            parser = build_verb_parser(verb)
            if verb in STEERING_VERBS:
                add_steering_arguments(verb, parser)
            args = parser.parse_args(argv[1:])
            args.verb = verb
            handlers: dict[str, Callable[[argparse.Namespace, Mapping[str, str]], int]] = {
                "wait": cmd_wait,
                "status": cmd_status,
                "kill": cmd_kill,
                "reap": cmd_reap,
                "approve": cmd_answer,
                "deny": cmd_answer,
                "send": cmd_send,
                "budget": cmd_budget,
                "agents": cmd_agents,
                "dag": cmd_dag,
                "estimate": cmd_estimate,
                **{v: cmd_workflow for v in WORKFLOW_VERBS},
                "state": cmd_state,
                "_run": functools.partial(cmd_background_runner, entry=main),
                "_guard": cmd_guard,
                "_gateway": lambda args, _environ: serve_gateway(Path(args.session)),
            }
            handler = handlers[verb]
            return handler(args, environ)
        if argv and not argv[0].startswith("-"):
            # The run path takes flags only: a first word is a mistyped verb or a bare task.
            raise UnknownVerbError(argv[0], [v for v in VERBS if not v.startswith("_")])
        return cmd_run(argv, environ, main)
    except SpawnError as exc:
        if traceback:
            raise
        print(f"spawn: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("spawn: error: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader closed our stdout (`status --json | head -c1`): it has
        # what it wanted. Point stdout at /dev/null so the final flush is quiet.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except OSError as exc:
        if traceback:
            raise
        print(f"spawn: error: {exc}; check the session directory and permissions", file=sys.stderr)
        return ExitCode.STATE
    except Exception as exc:
        # A bug or a record we did not foresee: one line, not a traceback,
        # and the state exit code, never "agent failed".
        if traceback:
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"spawn: error: internal error {type(exc).__name__}: {first}; rerun with --traceback for details", file=sys.stderr)
        return ExitCode.STATE


def use_bytecode_cache(environ: Mapping[str, str]) -> None:
    """Let the SDK's bytecode be written on first import and reused by every level.

    Every nested level imports the SDK again, and bytecode halves that. uv's
    compile-bytecode did it at install, but printed "Bytecode compiled N
    files" on every run. Python writes it itself on first import unless
    PYTHONDONTWRITEBYTECODE is set, or the environment is read-only; then a
    per-user cache directory takes it.
    """
    sys.dont_write_bytecode = False
    # The environment the SDK is installed in, beside psutil: found, not
    # imported (psutil is imported at first use, after the CLI's start).
    spec = importlib.machinery.PathFinder.find_spec("psutil")
    if spec is None or spec.origin is None:
        return
    site = Path(spec.origin).parent.parent
    if os.access(site, os.W_OK):
        return
    with contextlib.suppress(OSError, RuntimeError):
        cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spawn-py" / "pycache"
        cache.mkdir(parents=True, exist_ok=True)
        sys.pycache_prefix = str(cache)


def console_main() -> NoReturn:
    """The CLI as a program: `python spawn.py ...`, and the `spawn` command of the installed package."""
    use_bytecode_cache(os.environ)
    install_fast_start(os.environ)
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (tens of ms with the SDK loaded): every record
    # is already durable and every file closed, and a parent waits on us.
    os._exit(code)


if __name__ == "__main__":
    console_main()
