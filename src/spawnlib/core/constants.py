"""Numbers and names, each with its why: files of the protocol, environment variables, limits."""

from __future__ import annotations

import re
import sys
from pathlib import Path

# ---------------------------------------------------------------- constants --

# The source file, also when the interpreter runs the compiled copy children
# get (compiled_script): the code's own file name survives compilation,
# __file__ would name the .pyc.
_CODE_FILE = Path(sys._getframe(0).f_code.co_filename).resolve()
# Imported as the package spawnlib (the unit tests, the type checker), the
# runnable form is the spawn.py that tools/bundle.py generates beside src/:
# what an agent's children run. In spawn.py itself the code's file is the script.
SCRIPT_PATH = _CODE_FILE.parents[__name__.count(".") + 1] / "spawn.py" if __name__.startswith("spawnlib.") else _CODE_FILE
SCRIPT_DIR = SCRIPT_PATH.parent
# What the user typed: `spawn`, the installed package's console script, else
# spawn.py. Usage lines and the commands printed for a person to type say it.
PROGRAM_NAME = "spawn" if Path((getattr(sys, "argv", None) or [""])[0]).name == "spawn" else "spawn.py"


def project_dir(script: Path) -> Path:
    """Where the project's schemas/, workflows/ and sessions/ are: beside spawn.py.

    Installed as the package spawn (pyproject.toml), the script is
    site-packages/spawn/__init__.py, with no project beside it: the working
    directory's then, as a copy of spawn.py is run from beside them.
    """
    if script.name != "__init__.py":
        return script.parent
    try:
        return Path.cwd()
    except OSError:  # a working directory deleted under us
        return script.parent


PROJECT_DIR = project_dir(SCRIPT_PATH)
SCHEMA_DIR = PROJECT_DIR / "schemas"
DEFAULT_SESSION_ROOT = PROJECT_DIR / "sessions"

# Version of the on-disk records; bump when a field changes meaning.
PROTOCOL_VERSION = 1

# Environment variables: the only channel from a parent agent to the children
# its Bash starts. Documented in docs/environment.md.
ENV_SESSION_ROOT = "SPAWN_SESSION_ROOT"  # where root invocations create sessions
ENV_SESSION = "SPAWN_SESSION"  # the session directory a tree shares
ENV_AGENT_ID = "SPAWN_AGENT_ID"  # id of the agent whose Bash runs this command
ENV_DEPTH = "SPAWN_DEPTH"  # depth of that agent (root = 0)
ENV_MAX_DEPTH = "SPAWN_MAX_DEPTH"  # deepest depth the tree may reach
ENV_DEADLINE = "SPAWN_DEADLINE"  # absolute deadline, Unix seconds
ENV_BUDGET = "SPAWN_MAX_BUDGET_USD"  # that agent's budget, children get no more
ENV_TOOLS = "SPAWN_TOOLS"  # that agent's tools, children get a subset
ENV_TRACEPARENT = "SPAWN_TRACEPARENT"  # W3C traceparent of that agent
ENV_MODEL_TIERS = "SPAWN_MODEL_TIERS"  # "high-tier=ID,medium-tier=ID,..."
ENV_CLI = "SPAWN_CLI"  # path to a claude CLI instead of the bundled one
ENV_PYTHON = "SPAWN_PYTHON"  # interpreter children should use (set for the CLI)
ENV_SCRIPT = "SPAWN_PY"  # path of this script (set for the CLI)
ENV_HEARTBEAT = "SPAWN_HEARTBEAT_S"  # heartbeat period in seconds
ENV_DENY = "SPAWN_DENY"  # JSON list: deny rules every descendant inherits
ENV_ASK = "SPAWN_ASK"  # JSON list: ask rules every descendant inherits
ENV_PERMISSION_MODE = "SPAWN_PERMISSION_MODE"  # the agent's mode; children get no more
ENV_MODEL = "SPAWN_MODEL"  # the agent's model, for `model: inherit`
ENV_ASK_TIMEOUT = "SPAWN_ASK_TIMEOUT_S"  # seconds before an unanswered ask is denied
ENV_FULL_SDK_IMPORT = "SPAWN_FULL_SDK_IMPORT"  # 1: import the SDK with its mcp package
ENV_CACHE_DIR = "SPAWN_CACHE_DIR"  # per-user cache (CLI tool lists); default $XDG_CACHE_HOME/spawn
ENV_NO_CGROUP = "SPAWN_NO_CGROUP"  # 1: don't put trees in cgroups; fall back to the subreaper
ENV_IDLE_TIMEOUT = "SPAWN_IDLE_TIMEOUT_S"  # that agent's idle timeout; children get no longer
ENV_WAIT_POLL = "SPAWN_WAIT_POLL"  # 1: wait polls outcomes (a session directory other hosts write)
ENV_SPAWN_PLACEMENT = "SPAWN_PLACEMENT"  # ray:ADDRESS places agents on a Ray cluster (docs/cluster.md)
ENV_RAY_SIBLING = "SPAWN_RAY_SIBLING"  # path of tools/ray_place.py when it is not beside spawn.py
ENV_RAY_PYTHON = "SPAWN_RAY_PYTHON"  # a python with the sibling's lock installed (else `uv run --script`)
ENV_RAY_STANDIN = "SPAWN_RAY_STANDIN"  # set by the host actor: the token pid a placed runner's meta.json names
ENV_RAY_PLACER = "SPAWN_RAY_PLACER"  # set by the host actor: its socket, where a placed agent's children are placed from
# SESSION/placement/HOST-HASH.{json,lock,log}: the session's placement service on a launcher host (tools/ray_place.py).
PLACEMENT_DIR = "placement"
ENV_CALL = "SPAWN_CALL"  # the Bash call's token, set by a host of in-process agents (supervise/calls.py)
CALLS_DIR = "calls"  # in a host's agent directory: one record per Bash call's token (supervise/calls.py)
ENV_RAY_PLACE_TIMEOUT = "SPAWN_RAY_PLACE_TIMEOUT"  # seconds a launcher waits for a placement (RAY_PLACE_TIMEOUT_S)
RAY_SIBLING = "ray_place.py"
# Connecting to a cluster and starting an actor's worker takes seconds (a
# fresh worker imports Ray); past this the agent is not placed at all.
RAY_PLACE_TIMEOUT_S = 120.0
# The placing side gives up this share of the launcher's limit earlier, so
# that it, not the launcher, says why (the placement's state, where to look).
RAY_PLACE_MARGIN = 0.25
# The placing side's last word when an agent ended without its runner's outcome (tools/ray_place.py writes it).
RAY_STANDIN_EXIT = "standin-exit.json"
# OpenTelemetry's own variables: set, the root exports the tree's spans when it ends.
ENV_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

# Tiers are aliases the CLI itself resolves to the current model of each
# family, so the table does not go stale when models are released.
DEFAULT_MODEL_TIERS: dict[str, str] = {
    "high-tier": "opus",
    "medium-tier": "sonnet",
    "low-tier": "haiku",
}
DEFAULT_MODEL = "medium-tier"
# What --model accepts besides a tier: the pinned CLI's own aliases (its list
# holding both opusplan and sonnet[1m]; tests/test_first_week.py reads it from
# the CLI's binary, so a new alias fails a test instead of a user's agent file),
# "default", and ids of the shapes Anthropic's API, Vertex (@version) and
# Bedrock (region.anthropic.…:N, ARNs) use. A typo like "opsu" would otherwise
# reach the CLI and fail only after the agent started.
CLI_MODEL_ALIASES = ("default", "sonnet", "opus", "haiku", "fable", "best", "sonnet[1m]", "opus[1m]", "fable[1m]", "opusplan")
MODEL_ID_PATTERN = (
    r"(?:[a-z]{2,4}\.)?(?:anthropic\.)?claude-[a-z0-9][a-z0-9.\-]*(?:@[a-z0-9.\-]+|:[0-9]+)?(?:\[1m\])?"
    r"|(?:opus|sonnet|haiku|fable)\[1m\]"
    r"|arn:aws:bedrock:\S+"
)
# The families an id names (claude-FAMILY-N, claude-N-N-FAMILY). A word of an id
# close to one of them but not it is a typo (claude-sonet-4): refused with the
# id spelled right. A word far from all of them may be a family released after
# this list, or a gateway's own name: accepted, as the CLI accepts it.
MODEL_FAMILIES = ("opus", "sonnet", "haiku", "fable", "mythos")

# Three levels below the root covers the deep workflows we know of; deeper
# trees must ask for it explicitly.
DEFAULT_MAX_DEPTH = 3

# Largest sane value of each number a user or a definition gives. Anything
# above is a typo (1e99 overflows timers) and is refused, not clamped.
MAX_SECONDS = 366 * 86400.0  # a deadline a year out is already "none"
MAX_BUDGET_USD = 1_000_000.0
MAX_COUNT = 1_000_000  # turns, agents
MAX_TOKENS = 100_000_000  # a context window; 100x today's largest is a typo
MAX_CONCURRENT = 10_000
MAX_DEPTH_LIMIT = 1000

# Read-only by default: Bash (and so nesting) must be asked for.
DEFAULT_TOOLS = ("Read", "Grep", "Glob")

# Built-in tool names of Claude Code; MCP tools are accepted as mcp__server__tool.
# A seed only: the tools the CLI reports in its init message are cached per CLI
# version (remember_cli_tools) and added to these, so new tools aren't unknown.
KNOWN_TOOLS = frozenset(
    {
        "Agent", "AskUserQuestion", "Bash", "BashOutput", "CronCreate", "CronDelete", "CronList", "DesignSync",
        "Edit", "EnterPlanMode", "EnterWorktree", "ExitPlanMode", "ExitWorktree", "Glob", "Grep",
        "KillShell", "LS", "ListAgents", "ListMcpResourcesTool", "LSP", "Monitor", "MultiEdit",
        "NotebookEdit", "NotebookRead", "Read", "ReadMcpResourceTool", "ReportFindings", "ScheduleWakeup",
        "SendMessage", "Skill", "SlashCommand", "Task", "TaskCreate", "TaskGet", "TaskList",
        "TaskOutput", "TaskStop", "TaskUpdate", "TodoWrite", "ToolSearch", "WebFetch",
        "WebSearch", "Workflow", "Write",
    }
)  # fmt: skip

# Legacy tool names Claude Code still accepts, and the name it uses now. A
# name is canonicalised wherever it is read (tools, disallowed tools, rules),
# so `--deny 'Task(*)'` also stops `Agent`.
TOOL_ALIASES: dict[str, str] = {"Task": "Agent", "KillShell": "TaskStop"}

# Claude Code's agent frontmatter (CLI 2.1.x), and what spawn.py adds to it
# (docs/agents.md has one row per field).
CLAUDE_AGENT_FIELDS = frozenset(
    {
        "name", "description", "tools", "disallowedTools", "model", "permissionMode", "mcpServers",
        "hooks", "maxTurns", "skills", "memory", "background", "effort", "isolation", "color",
        "initialPrompt", "omitClaudeMd", "autoCompactWindow",
    }
)  # fmt: skip
SPAWN_AGENT_FIELDS = frozenset({"schema", "max_depth", "timeout", "max_budget_usd", "permissions", "kind", "url", "command"})
EFFORT_LEVELS = ("low", "medium", "high", "xhigh", "max")
MEMORY_SCOPES = ("user", "project", "local")
PERMISSION_KINDS = ("allow", "deny", "ask")

# From most to least restrictive; a child's mode is never further down than
# its parent's. "auto" lets a classifier approve calls, so it ranks with
# acceptEdits; bypassPermissions only where the root had it.
PERMISSION_MODES = ("plan", "dontAsk", "default", "acceptEdits", "auto", "bypassPermissions")
PERMISSION_RANK = {"plan": 0, "dontAsk": 1, "default": 2, "acceptEdits": 3, "auto": 3, "bypassPermissions": 4}
# Nobody answers a prompt in a nested agent: what isn't granted is denied.
DEFAULT_PERMISSION_MODE = "dontAsk"
# --sandbox: auto puts the Bash of agents below the root in Claude Code's
# sandbox (they run commands a model wrote); the root is the user's own call.
SANDBOX_CHOICES = ("on", "off", "auto")
# What Linux needs for Claude Code's sandbox, and how Debian/Ubuntu install it.
# macOS needs only sandbox-exec (Seatbelt), which ships with it.
SANDBOX_PROGRAMS = ("bwrap", "socat")
SANDBOX_INSTALL = "apt-get install bubblewrap socat"
SANDBOX_MACOS_PROGRAM = "sandbox-exec"
# What an agent's Bash loses when --sandbox auto can't sandbox it (docs/guarantees.md
# threat model): said once on the root's stderr and in each such meta.json.
SANDBOX_LOST = (
    "their Bash runs as you, so it can write outside their allowed paths, "
    "write the session's records other agents trust (outcomes, the ledger), "
    "and start processes outside their tree"
)
# Where the CLI talks to when ANTHROPIC_BASE_URL is unset: a nested spawn in
# Bash must still reach it through the sandbox's proxy.
DEFAULT_API_HOST = "api.anthropic.com"

# Tools a file rule of Claude Code's covers: Read rules cover the tools that
# read files, Edit rules the ones that change them.
READ_TOOLS = frozenset({"Read", "Grep", "Glob", "LS", "NotebookRead"})
EDIT_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})

# An `ask` nobody answers is denied after this long (or at the deadline).
ASK_TIMEOUT_S = 300.0
ASK_POLL_S = 0.1

# Claude Code shows an agent the first 200 lines of its MEMORY.md.
MEMORY_HEAD_LINES = 200

# Routing: below this BM25 score (about one distinctive word matched) the task
# goes to the default agent. K1 and B are BM25's usual term-frequency
# saturation and length normalisation.
# --route: by the descriptions' words (agents.route), or by one low-tier model call (model_router).
ROUTE_CHOICES = ("lexical", "model")
ROUTE_THRESHOLD = 1.5
ROUTE_K1 = 1.2
ROUTE_B = 0.75
ROUTE_NAME_WEIGHT = 1.5  # a word of the agent's name counts this much more
ROUTE_WHEN_WEIGHT = 0.5  # a word of its "use when" clauses: a third of a name's bonus, a trigger is a looser summary
# Words that say nothing about which agent fits, including the boilerplate of
# public collections' <example> blocks (user:, assistant:, commentary:).
ROUTE_STOPWORDS = frozenset(
    "a about after all also an and any are as ask asks assistant at be been before but by can commentary context "
    "could do does done each example examples for from get has have help here how i if in into is it its just launch "
    "let like ll make me more my need needs new now of on one or our out please proactively should so some such "
    "sure task tasks than that the their them then there these they this to tool use used user uses using via want "
    "wants we what when where which while who why will with work would you your agent agents "
    # Words that say nothing of a task's field: "Say hello" is for the default agent.
    "not no nor never say says said tell hello hi hey thanks thank".split()
)


# A parent reads a child's stdout into its context window: keep it bounded.
# 16 KiB is about 4k tokens, enough for a structured result, small enough to
# read a dozen children. The full output is always in outcome.json.
STDOUT_OUTPUT_LIMIT = 16 * 1024

# A parent needs time after its child's deadline to read the result and answer.
PARENT_GRACE_S = 5.0

# Between SIGTERM and SIGKILL: long enough for spawn.py to commit an outcome
# and end its own subtree (which itself waits this long), short enough that a
# kill feels immediate.
KILL_GRACE_S = 3.0
# What a stopping runner gives its stop hooks (an a2a node's remote cancel above
# all), counted from the stop: a killer waits 2 * KILL_GRACE_S for the runner
# (settle_agents), and the outcome's commit and the exit need the last second.
STOP_HOOKS_S = 2 * KILL_GRACE_S - 1.0

# Between SIGTERM and SIGKILL for what is not a live agent's spawn.py (a CLI
# whose spawn.py is gone, its tools, leftovers after a normal end): nothing
# there commits an outcome, so it only gets a moment to flush and exit.
LEFTOVER_GRACE_S = 1.0

# A tree's cgroup is named spawn-SESSION-AGENT, so trees of different
# sessions (and users of one machine) never share one, and the name says who
# made it. After cgroup.kill the kernel empties it within milliseconds; the
# limit only bounds a guard facing a process stuck in the kernel (D state).
CGROUP_PREFIX = "spawn-"
CGROUP_EMPTY_WAIT_S = 5.0

# How often `wait` looks for outcomes and how often it checks that the
# processes it waits for still exist (2 s target). Where the kernel tells
# wait of process exits (pidfd) and new files (inotify), liveness is only
# polled for what it can't watch.
# Outcomes: a few pending agents are polled often, each poll reading one
# small file per agent (~10 us), which beats inotify for latency: the kernel
# waits out an RCU grace period (6-12 ms measured) when a process holding
# watches exits, and a parent waits for that exit. The period grows by
# WAIT_POLL_PER_AGENT_S per agent, so CPU stays flat (<3% of a core); past
# WAIT_POLL_BATCH agents, inotify is used instead and costs ~0 while idle.
WAIT_POLL_S = 0.005
WAIT_POLL_PER_AGENT_S = 0.0004
WAIT_POLL_BATCH = 50
WAIT_POLL_MAX_S = 1.0
LIVENESS_POLL_S = 0.5
LIVENESS_POLL_MAX_S = 2.0
# With events, every pending outcome is still re-read now and then, in case
# an event was lost; the period doubles up to the cap (a missed event then
# costs at most that long, never a hang).
WAIT_RESCAN_S = 1.0
WAIT_RESCAN_MAX_S = 8.0
# Agents' heartbeats wake wait too (a file renamed into their directory):
# after a wake that brought nothing, wait lets such events pile up this long,
# so a thousand beating agents cost 20 wakes a second, not hundreds (only
# waits over WAIT_POLL_BATCH agents watch). A marker that lands meanwhile
# is seen at most this late.
WAIT_NOISE_HOLDOFF_S = 0.05

# Heartbeat refresh period (SPAWN_HEARTBEAT_S overrides it, e.g. in tests);
# an agent is stale after 6 missed beats: long enough to ride out a busy
# machine, short enough that `wait` doesn't sit on a wedged agent for long.
HEARTBEAT_S = 5.0
HEARTBEAT_STALE_BEATS = 6

# The Bash tool's default 2-minute command timeout would kill nested spawns
# that take longer; spawn.py enforces its own deadlines instead.
BASH_TIMEOUT_MS = "3600000"

# Without a deadline, a spawn waits at most this long for a --max-concurrent
# slot; then it ends with status timeout rather than waiting forever.
SLOT_WAIT_S = 600.0
SLOT_POLL_S = 0.2

# A background runner waits this long for its launcher to register it.
REGISTER_WAIT_S = 10.0

# A root given no --timeout still ends: an hour covers the long workflows we
# know of, and a stuck tree costs at most that. `--timeout 0` means none.
DEFAULT_ROOT_TIMEOUT_S = 3600.0

# An agent whose CLI wrote no transcript event and used no CPU for this long
# is stalled (a hung model stream, a stopped process): it is ended. Five
# minutes is longer than any model turn or quiet tool call we have seen.
IDLE_TIMEOUT_S = 300.0
# An idle node process still ticks: below this share of one core, the CLI's
# process group counts as using no CPU.
IDLE_CPU_SHARE = 0.02
# How often the idle watch looks (at most; shorter for short idle timeouts).
IDLE_CHECK_S = 5.0

# USD per million tokens (input, output), to estimate what an agent spent when
# it ended without the CLI's own total (killed, timed out, died). List prices
# of each family; a model the table doesn't name is priced as medium-tier,
# which is also what the CLI charges for a model it doesn't know. Cache reads
# cost 0.1x input and cache writes 1.25x, as on the API.
MODEL_PRICES_USD_PER_MTOK: dict[str, tuple[float, float]] = {
    "opus": (5.0, 25.0),
    "sonnet": (3.0, 15.0),
    "haiku": (1.0, 5.0),
    "fable": (8.0, 40.0),  # the pinned CLI's catalog price of claude-fable-5-2, what `fable` names
}
# CLI aliases that name no family: what the pinned CLI resolves them to (`best`
# asks for claude-opus-5-5 against the scripted model).
ALIAS_PRICE_FAMILY = {"best": "opus"}
FALLBACK_PRICE_FAMILY = "sonnet"
CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25
CACHE_WRITE_1H_FACTOR = 2.0  # a write kept for an hour (cache_control ttl "1h")
# The token counts usage records carry (outcome, ledger, status), each priced differently.
USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")

# The header above an agent's own facts (id, deadline, time left, budget) in its
# first message, after its task. They differ from sibling to sibling, so they stay
# out of the system prompt: tools and system prompt are the head the CLI marks for
# the prompt cache, which siblings then share byte for byte. tools/mock_model.py
# keys its scripted retries on the text before this header.
AGENT_FACTS_HEADER = "## spawn.py: this agent"
# `estimate`: tokens of the head (tool definitions, system prompt, briefing) that
# the tasks of one fan-out share in the prompt cache. Roughly Claude Code's
# definitions of a few tools plus spawn.py's system prompt; the first task of the
# level writes it (1.25x), the others read it (0.1x). Applied to default
# estimates only: a median of ended agents already holds what their reads saved.
FANOUT_HEAD_TOKENS = 3_000
# Task options that change neither tools nor system prompt: tasks of a level
# that differ only in these send the same head.
HEAD_NEUTRAL_OPTIONS = frozenset({"timeout", "max_budget_usd", "topic", "output", "idle_timeout"})

# What one agent is expected to cost, by price family, when the session has no
# ended agent of that family to take a median from (--confirm-over, `estimate`).
# Roughly a short agent's few turns (~40k input, ~4k output tokens, much of it
# cache reads) at MODEL_PRICES_USD_PER_MTOK, rounded up: an estimate that errs
# high asks a person once too often, one that errs low lets a fan-out through.
DEFAULT_AGENT_COST_USD: dict[str, float] = {
    "haiku": 0.02,
    "sonnet": 0.10,
    "opus": 0.50,
    "fable": 0.80,
}
# And how long it takes, for a graph's critical path: a few model turns and
# tool calls. Per-session medians replace it with `estimate --session`.
DEFAULT_AGENT_SECONDS = 60.0

# A budget hold smaller than this can't pay for one turn: admission refuses
# rather than start an agent that is stopped by its first answer.
MIN_HOLD_USD = 0.01

# The OTLP exporter is a sibling with its own dependencies (tools/), run once
# per tree by the root; a collector that hangs must not hold the root for long.
OTEL_EXPORTER = Path("tools") / "otel_export.py"
OTEL_EXPORT_TIMEOUT_S = 120.0

# `status --watch` redraws twice a second: live enough to see a state change
# at once, and each redraw only reads a few small files per agent.
WATCH_REFRESH_S = 0.5

DEFAULT_SYSTEM_PROMPT = """\
You are an agent started by spawn.py to do one task. Work with the tools you \
have, do not ask questions (nobody is watching), and keep the final answer \
short and factual. When an output schema is set, give your final answer by \
calling the StructuredOutput tool exactly once."""

# Environment variable names whose values are secrets. Values of these (and of
# any variable whose name looks secret) are scrubbed from every record.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
SECRET_PATTERN = re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}")
SECRET_MIN_LEN = 8  # shorter values are too likely to match ordinary text
REDACTED = "[REDACTED]"

# ------------------------------------------------------- on-disk protocol --

META = "meta.json"
OUTCOME = "outcome.json"
SCRATCH_DIR = "scratch"  # a sandboxed leaf's own writable directory, its records beside it read-only
# refused/<leaf id>/: a sandboxed leaf's refused spawns, each <child id>.json,
# until the leaf's runner, outside the sandbox, records them in agents/.
REFUSED_DIR = "refused"
# requests/<agent id>/: a sandboxed spawner's drop box. The spawn.py in its
# Bash leaves each spawn or kill there as a request; its runner, outside the
# sandbox, runs it as its own agent's and writes the reply beside it (broker).
REQUESTS_DIR = "requests"
# What a leaf's runner takes from its drop box: a hostile leaf gets no more
# agent directories than this, nor bigger records, by writing there.
DROPPED_REFUSALS_MAX = 64
DROPPED_REFUSAL_MAX_BYTES = 256 * 1024
DROP_BOX_POLL_S = 1.0  # a listing of a directory that is nearly always empty
OUTCOME_KEPT = "outcome.kept.json"  # the runner's own, when outcome.json turned out not to be an outcome
TRANSCRIPT = "transcript.jsonl"
STDERR_LOG = "stderr.log"
# An agent's transcript and stderr.log each stop growing at this size: a
# flooding peer or process can't fill the disk (a remote A2A agent's endless
# status updates wrote 379 MB in 20 s). Far above a long agent's transcript;
# SPAWN_TRANSCRIPT_MAX_BYTES sets it lower, never higher.
LOG_MAX_BYTES = 64 * 1024 * 1024
ENV_LOG_MAX = "SPAWN_TRANSCRIPT_MAX_BYTES"
TRUNCATED_LINE = "TranscriptTruncated"  # the transcript's last line once it reached the cap
NATIVE_LOG = "native.jsonl"  # Claude Code's own subagents (the Agent tool) started by this agent
HEARTBEAT = "heartbeat.json"
PAUSED = "paused.json"  # while an agent waits at its budget (--on-budget pause; docs/steering.md)
# Written by `spawn.py kill` before its SIGTERM: the runner's outcome then
# says who ended it, which a signal alone can't tell it.
KILL_REQUEST = "kill.json"
RUNNER_LOG = "runner.log"
SESSION_INFO = "session.json"
LIMITS = "limits.json"
LEDGER = "ledger.jsonl"
SESSION_LOCK = ".lock"
SLOT_MARKER = ".slot"


# Deepest nesting of any JSON or YAML spawn.py parses. The parser recurses
# once per level (RecursionError near 1,000, sooner on a deep stack), and so
# does whatever walks the value after it (jsonschema, json.dumps): 64 is
# deeper than any record, schema or task graph, and far from either limit.
JSON_MAX_DEPTH = 64
# Largest record read: an outcome's output or a transcript line is at most a
# few MiB (SDK_MAX_MESSAGE); a bigger file is junk, and never read into memory.
RECORD_MAX_BYTES = 64 << 20
# Largest YAML or JSON input a user gives (a task graph, a schema, an agent's
# frontmatter): hand-written files are KiBs.
INPUT_MAX_BYTES = 4 << 20
# YAML aliases share one node in the parsed document, but whatever walks it
# (variables, json.dumps) meets every copy: "billion laughs" is a few lines
# that expand to 10**9 nodes. A document may expand to this many at most.
YAML_MAX_NODES = 1_000_000

SLOT_LENT = ".slot-lent"
