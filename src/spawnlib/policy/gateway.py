"""The tree's model gateway: every agent's model calls pass through it, metered where they are spent.

The root's runner starts one per tree (start_gateway) before its own CLI,
hands it the real credential on a pipe, and removes that credential from
its own environment, so no agent below inherits it. Every agent's CLI gets
ANTHROPIC_BASE_URL at the gateway and a credential of its own (mint_credential,
by the agent's runner after admission); the session keeps only the
credential's sha256, so a file an agent reads names no credential.

Per request, the gateway (serve_gateway, in its own process: its imports of
uvicorn and httpx are paid there, never on a leaf's path):
- names the agent by its credential (401 for one it never minted);
- under a tree budget, checks the request against the agent's hold
  (hold_plan): the input priced high, plus an output allowance it enforces
  by lowering the request's max_tokens; a request its hold can't pay for is
  refused (`--on-budget fail`) or held, with no upstream call, until a raise
  covers it (`pause`);
- passes the answer through chunk by chunk and prices it from the API's own
  usage (message_start, then the final message_delta: input, output, cache
  reads, cache writes), or, for a stream cut short, the input side and the
  output deltas' bytes / 4;
- appends a `spend` line to the ledger for it (ledger.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.constants import CACHE_READ_FACTOR, CACHE_WRITE_1H_FACTOR, CACHE_WRITE_FACTOR, MODEL_PRICES_USD_PER_MTOK, USAGE_COUNTS
from ..core.errors import RefusedError, SpawnError, UsageError
from ..core.prelude import unix_address
from ..core.pure import claude_config_dir, float_or_none, price_family, round_usd, utc_now_iso
from ..session.ledger import (
    MAC,
    LedgerState,
    LedgerTail,
    append_budget_change,
    append_ledger,
    ledger_entries,
    ledger_lines,
    ledger_usd,
    overdrawn,
    record_budget_refusal,
    top_up_hold,
    tree_caller_refusal,
)
from ..session.protocol import flocked, load_meta, read_json, session_lock, write_json_atomic
from ..supervise.supervisor import Supervised, calling_agents, in_tree_cgroup, owned_cgroup, roots_running, session_roots
from .channel import bind_private_socket, peer_process, read_line
from .upstream import Upstream, proxied

GATEWAY_DIR = "gateway"  # in the session: gateway.json and credentials/
GATEWAY_RECORD = "gateway.json"  # {url, pid, create_time}: where the tree's gateway listens, and which process it is
CONTROL_SOCKET = "control.sock"  # in gateway/, mode 0600: `budget` changes reach the gateway here, whose kernel names the caller
# The lines that decide money that only the gateway writes: a line of these kinds without its MAC is
# believed by no gateway (anyone who can append to ledger.jsonl could write one). A reserve line with
# topped_up_usd is a hold grown from a raise; the holds admission takes are checked by ledger.overdrawn.
SIGNED_KINDS = ("spend", "refused", "budget")
CONTROL_MAX_BYTES = 64 << 10
CONTROL_READ_S = 5.0
CREDENTIALS_DIR = "credentials"  # one file per minted credential, named by its sha256, holding the agent id
SUBAGENTS_DIR = "subagents"  # HOST/NATIVE_ID: the agent id of an in-process agent, by its CLI's x-claude-code-agent-id
AGENT_ID_HEADER = "x-claude-code-agent-id"  # sent by the pinned CLI on each request of a nested subagent (2.1.329)
ENV_GATEWAY_PRICES = "SPAWN_GATEWAY_PRICES"  # JSON {family: [input, output] USD per Mtok}: overrides the pinned table
ENV_GATEWAY_MAX_CALLS = "SPAWN_GATEWAY_MAX_CALLS"  # N: at most N model calls of the tree upstream at once (the rest wait)
# S: a call whose cacheable head (model, tools, system) another call is writing to the prompt cache waits at
# most S seconds for that call to start answering, then reads the head instead of writing it again; 0: no waits.
ENV_GATEWAY_STAGGER = "SPAWN_GATEWAY_STAGGER_S"
STAGGER_WAIT_S = 5.0  # the default: a first byte takes a second or two, a slow one must not hold its siblings long
CACHE_TTL_S = {"5m": 300.0, "1h": 3600.0}  # how long the API keeps a prefix after its last use
STAGGER_HEADS_KEPT = 256  # heads remembered before the stale ones are forgotten
# 1: the root starts the tree's gateway even without a budget; 0: never (see
# gateway_choice). A tree without one keeps its budget from what each CLI reports (soft).
ENV_GATEWAY = "SPAWN_GATEWAY"
REAL_CREDENTIAL_VARS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
OAUTH = "oauth"  # the credential's kind for a claude.ai login's token: sent as a bearer token with OAUTH_BETA
OAUTH_BETA = "oauth-2025-04-20"  # the API takes an OAuth token only with this beta
API_KEY_HELPER_TIMEOUT_S = 30.0
DEFAULT_UPSTREAM = "https://api.anthropic.com"
# The input side is priced before the answer says what it was: from the
# request's bytes, at a rate no tokenizer beats (3 bytes a token; the API's
# tokens average about 4), all of it as a 5-minute cache write (the dearest
# input but the hour-long write, which spawn.py's agents don't ask for).
INPUT_BYTES_PER_TOKEN = 3
# An output allowance smaller than this is no turn: the request is refused (or held).
MIN_OUTPUT_TOKENS = 256
CUT_BYTES_PER_TOKEN = 4  # a cut stream's output: its deltas' bytes at this rate
GATEWAY_PAUSE_POLL_S = 0.5
GATEWAY_INFLIGHT_POLL_S = 0.05  # a call short only of its agent's calls in flight looks again this often
SETTLE_WAIT_S = 3.0  # a runner waits this long for its agent's last calls to be charged
RATE_RETRIES = 8  # a call the API rate-limits is sent again this often before its 429 is passed on
RATE_BACKOFF_MAX_S = 30.0  # the longest wait between tries without a retry-after
# Where the tree's gateway listens unless it is placed on a cluster (gateway_listen).
LOOPBACK = "127.0.0.1"


# ------------------------------------------------------------------- pure --


def call_cap(environ: Mapping[str, str]) -> int | None:
    """SPAWN_GATEWAY_MAX_CALLS as a positive count; None: no cap (unset, or not a positive integer)."""
    with contextlib.suppress(ValueError):
        cap = int(environ.get(ENV_GATEWAY_MAX_CALLS) or "0")
        return cap if cap > 0 else None
    return None


def stagger_limit(environ: Mapping[str, str]) -> float:
    """SPAWN_GATEWAY_STAGGER_S as seconds (unset or not a number: the default; 0 or less: no waits)."""
    with contextlib.suppress(ValueError):
        value = float(environ.get(ENV_GATEWAY_STAGGER) or STAGGER_WAIT_S)
        return max(0.0, value) if math.isfinite(value) else STAGGER_WAIT_S
    return STAGGER_WAIT_S


def cache_head(request: Mapping[str, Any]) -> tuple[str, float] | None:
    """(a digest of the model and the request's tools and system up to their last cache_control breakpoint, that
    entry's TTL in seconds); None when tools and system carry no breakpoint (the request writes no head a sibling reads).

    The API caches a prefix at each breakpoint, so what siblings share is the head up to the last one in tools
    and system (the CLI marks its system blocks); blocks count without their marker, as the API compares them.
    """
    tools, system = request.get("tools"), request.get("system")
    blocks = [b for b in (tools if isinstance(tools, list) else []) if isinstance(b, dict)]
    blocks += [b for b in (system if isinstance(system, list) else []) if isinstance(b, dict)]
    marked = [n for n, b in enumerate(blocks) if isinstance(b.get("cache_control"), dict)]
    if not marked:
        return None
    last = marked[-1]
    head = [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks[: last + 1]]
    raw = json.dumps([str(request.get("model") or ""), head], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    ttl = CACHE_TTL_S.get(str(blocks[last]["cache_control"].get("ttl") or "5m"), CACHE_TTL_S["5m"])
    return hashlib.sha256(raw.encode()).hexdigest(), ttl


def stagger_role(now: float, fresh_until: float, writing: bool) -> str:
    """What a call with a cacheable head does now: "read" (the head is in the cache: go), "write" (nobody is
    writing it: go, and be the one whose answer the others wait for), or "wait" (another call is writing it)."""
    if now < fresh_until:
        return "read"
    return "wait" if writing else "write"


def credential_digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


def price_table(environ: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """The pinned per-family price table, with SPAWN_GATEWAY_PRICES's overrides (bad entries are ignored)."""
    table = dict(MODEL_PRICES_USD_PER_MTOK)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        for family, pair in json.loads(environ.get(ENV_GATEWAY_PRICES) or "{}").items():
            price_in, price_out = (float(v) for v in pair)
            if math.isfinite(price_in) and math.isfinite(price_out) and price_in >= 0 and price_out >= 0:
                table[str(family)] = (price_in, price_out)
    return table


def family_prices(model: str, table: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    exact = table.get(model)
    return exact if exact is not None else table.get(price_family(model), MODEL_PRICES_USD_PER_MTOK[price_family(model)])


def price_usage(model: str, usage: Mapping[str, Any], table: Mapping[str, tuple[float, float]]) -> float:
    """USD for one request's usage: input, cache reads (0.1x), cache writes (1.25x, 2x for an hour), output."""

    def count(source: Any, key: str) -> float:
        value = source.get(key) if isinstance(source, Mapping) else None
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0

    price_in, price_out = family_prices(model, table)
    written = count(usage, "cache_creation_input_tokens")
    one_hour = min(count(usage.get("cache_creation"), "ephemeral_1h_input_tokens"), written)
    read_in = count(usage, "input_tokens") + CACHE_READ_FACTOR * count(usage, "cache_read_input_tokens")
    read_in += CACHE_WRITE_FACTOR * (written - one_hour) + CACHE_WRITE_1H_FACTOR * one_hour
    return (read_in * price_in + count(usage, "output_tokens") * price_out) / 1e6


def hold_plan(
    room: float, body_bytes: int, model: str, max_tokens: int | None, table: Mapping[str, tuple[float, float]]
) -> tuple[int | None, float]:
    """(the max_tokens to forward, None: refuse; what the request can cost at most) for an agent with room USD left.

    The rule: the input is priced high (input_ceiling), and the output may take
    what is left, at most the request's own max_tokens. So a request's cost is
    at most its reservation unless its input is dearer than the ceiling.
    """
    price_in, price_out = family_prices(model, table)
    ceiling = input_ceiling(body_bytes, price_in)
    tokens = (room - ceiling) * 1e6 / price_out if price_out > 0 else math.inf
    allowance = math.floor(tokens) if math.isfinite(tokens) else (max_tokens or 1 << 20)
    if allowance < MIN_OUTPUT_TOKENS:
        return None, ceiling + MIN_OUTPUT_TOKENS * price_out / 1e6
    granted = allowance if max_tokens is None else min(max_tokens, allowance)
    return granted, ceiling + granted * price_out / 1e6


def input_ceiling(body_bytes: int, price_in: float) -> float:
    return math.ceil(body_bytes / INPUT_BYTES_PER_TOKEN) * CACHE_WRITE_FACTOR * price_in / 1e6


@dataclass
class StreamMeter:
    """The usage of one answer, read from the bytes passed through (SSE or one JSON body)."""

    usage: dict[str, Any] = field(default_factory=dict)
    output_bytes: int = 0
    final: bool = False
    """The answer's last usage (message_delta, or a whole JSON body) was seen."""
    buffer: bytes = b""
    model: str | None = None

    def feed_sse(self, chunk: bytes) -> None:
        self.buffer += chunk
        while b"\n\n" in self.buffer:
            frame, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in frame.split(b"\n"):
                if line.startswith(b"data:"):
                    with contextlib.suppress(ValueError):
                        self.event(json.loads(line[5:]))

    def event(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start" and isinstance(data.get("message"), dict):
            message = data["message"]
            self.model = message.get("model") if isinstance(message.get("model"), str) else None
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            delta = data["delta"]
            self.output_bytes += len(str(delta.get("text") or delta.get("partial_json") or delta.get("thinking") or "").encode())
        elif kind == "message_delta" and isinstance(data.get("usage"), dict):
            self.usage.update(data["usage"])  # cumulative counts
            self.final = True

    def feed_json(self, body: bytes) -> None:
        with contextlib.suppress(ValueError):
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                self.usage.update(data["usage"])
                self.model = data.get("model") if isinstance(data.get("model"), str) else None
                self.final = True

    def served(self) -> dict[str, Any]:
        """The usage to charge: the API's, or for a stream cut short its input side and its deltas' bytes / 4."""
        usage = dict(self.usage)
        if not self.final and usage:
            usage["output_tokens"] = self.output_bytes // CUT_BYTES_PER_TOKEN
        return usage


def canonical(line: Mapping[str, Any]) -> str:
    """A ledger line as its MAC covers it: every field but the MAC, in one spelling."""
    return json.dumps({k: v for k, v in line.items() if k != MAC}, sort_keys=True, separators=(",", ":"))


def canonical_digest(line: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(line), sort_keys=True).encode()).hexdigest()


def token_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(v) if isinstance(v := usage.get(k), int) and not isinstance(v, bool) and v > 0 else 0 for k in USAGE_COUNTS}


# ------------------------------------------------------- in every runner --


def gateway_url(session: Path) -> str | None:
    """The URL of the session's gateway, if the tree has one."""
    with contextlib.suppress(OSError, ValueError, Exception):
        record = read_json(session / GATEWAY_DIR / GATEWAY_RECORD)
        url = record.get("url")
        return url if isinstance(url, str) else None
    return None


@contextlib.contextmanager
def gateway_start_lock(session: Path) -> Iterator[None]:
    """Held while a root looks for the session's gateway and starts one: the roots of a shared session
    (an MCP server's) start at once, and one gateway must hold all of their calls."""
    folder = session / GATEWAY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with flocked(folder / ".start.lock"):
        yield


def gateway_gone(session: Path) -> int | None:
    """The pid of the session's gateway when its record stands but its process is gone (killed: it could not
    remove the record); None while it runs, or when the tree has none."""
    import psutil

    with contextlib.suppress(OSError, ValueError, Exception):
        record = read_json(session / GATEWAY_DIR / GATEWAY_RECORD)
        pid, started = record.get("pid"), record.get("create_time")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return None
        try:
            alive = psutil.Process(pid)
            if not isinstance(started, int | float) or abs(alive.create_time() - started) < 1.0:
                return None
        except psutil.Error:
            pass
        return pid
    return None


def mint_credential(session: Path, agent_id: str) -> str:
    """A fresh credential for one agent's CLI: the session keeps its sha256, naming the agent."""
    # os.urandom, not secrets: every spawn imports this module, and secrets pulls in hmac and _hashlib.
    credential = "sk-spawn-" + os.urandom(32).hex()
    folder = session / GATEWAY_DIR / CREDENTIALS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / credential_digest(credential), {"id": agent_id})
    return credential


def gateway_environment(session: Path, agent_id: str) -> dict[str, str]:
    """ANTHROPIC_BASE_URL and the agent's own credential, when the tree has a gateway; else nothing."""
    url = gateway_url(session)
    if url is None:
        return {}
    return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": mint_credential(session, agent_id)}


def plain_name(name: str) -> bool:
    """Whether a CLI's agent id can name a file of gateway/subagents/HOST/ (no folder, no hidden file)."""
    return bool(name) and "/" not in name and not name.startswith(".")


def name_subagent(session: Path, host: str, native_id: str, agent_id: str) -> None:
    """Tell the gateway which agent of the session a subagent of host's CLI is (its CLI's agent id names it)."""
    if gateway_url(session) is None or not plain_name(native_id):
        return
    folder = session / GATEWAY_DIR / SUBAGENTS_DIR / host
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / native_id, {"id": agent_id})


def settle_agent(session: Path, agent_id: str) -> None:
    """Wait (briefly) until the gateway has charged every call of this agent (its CLI has ended)."""
    import urllib.request

    url = gateway_url(session)
    if url is None:
        return
    with contextlib.suppress(OSError, ValueError):
        request = urllib.request.Request(f"{url}/_spawn/settle?agent={agent_id}", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=SETTLE_WAIT_S + 2) as reply:
            reply.read()


# ------------------------------------------------------------ in the root --


OTHER_PROVIDERS = ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY")


def gateway_choice(environ: Mapping[str, str], budget: float | None) -> tuple[bool, str | None]:
    """(does the root start the tree's gateway, why its budget stays soft or None).

    On by default for a tree with a budget, which is what it is for; SPAWN_GATEWAY=1
    starts one for any tree (its per-call records), =0 none. A tree that calls another
    provider runs without one: the gateway speaks the Anthropic API only, so its budget
    is kept from what each CLI reports. A tree placed on a cluster has one too, which
    its nodes reach where it listens (gateway_listen).
    """
    asked = environ.get(ENV_GATEWAY, "")
    wanted = asked == "1" or (asked != "0" and budget is not None)
    provider = next((v for v in OTHER_PROVIDERS if environ.get(v) in ("1", "true")), None)
    soft: str | None = None
    if provider is not None:
        soft = f"{provider} is set: the tree's gateway speaks the Anthropic API only"
    elif asked == "0":
        soft = f"{ENV_GATEWAY}=0"
    if not wanted or soft is not None:
        return False, soft if budget is not None else None
    return True, None


def gateway_listen(policy: str | None) -> str:
    """The address the tree's gateway listens on: loopback, unless the tree is placed on a Ray cluster.

    Then it is this host's address on the way to the cluster's head (the
    interface a UDP socket aimed there would use: nothing is sent), so that
    agents on every node reach it. Anywhere but loopback a call still needs an
    agent's own credential (401 otherwise), as on loopback.
    """
    import socket

    name, _, address = (policy or "").partition(":")
    if name != "ray" or not address.strip():
        return LOOPBACK
    host, _, port = address.strip().rpartition(":")
    if not host:  # `ray:auto` and kin: a cluster found locally; its head's address is this host's
        host, port = socket.gethostname(), "6379"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port) if port.isdigit() else 6379))
            found = str(probe.getsockname()[0])
    except OSError:
        return LOOPBACK
    return found if found != "0.0.0.0" else LOOPBACK


def soft_budget_warning(why: str) -> str:
    return f"budget: soft ({why}); it is kept from what each CLI reports, at its turns, and a turn under way may pass it"


def real_credential(environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """(the credential the gateway sends upstream, where it came from); ({}, why) when there is none.

    The CLI's own order: a key or token in the environment, then the user's
    apiKeyHelper, then the claude.ai login (CLAUDE_CODE_OAUTH_TOKEN, else the
    config folder's .credentials.json, whose path the gateway keeps to read
    the token again when the user's own CLI refreshes it).
    """
    found = {v: environ[v] for v in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN") if environ.get(v)}
    if found:
        return found, "the environment"
    config = claude_config_dir(environ)
    helper = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        helper = json.loads((config / "settings.json").read_text()).get("apiKeyHelper")
    if isinstance(helper, str) and helper.strip():
        try:
            done = subprocess.run(helper, shell=True, capture_output=True, text=True, timeout=API_KEY_HELPER_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {}, f"apiKeyHelper failed ({type(exc).__name__})"
        key = done.stdout.strip()
        if done.returncode != 0 or not key:
            return {}, f"apiKeyHelper failed (exit {done.returncode})"
        return {"ANTHROPIC_API_KEY": key}, "apiKeyHelper"
    if environ.get("CLAUDE_CODE_OAUTH_TOKEN"):
        return {OAUTH: environ["CLAUDE_CODE_OAUTH_TOKEN"]}, "CLAUDE_CODE_OAUTH_TOKEN"
    token = oauth_token(config / ".credentials.json")
    if token:
        return {OAUTH: token, "oauth_file": str(config / ".credentials.json")}, "the claude.ai login"
    return {}, "no API key, token, apiKeyHelper or claude.ai login was found for it to hold"


def oauth_token(path: Path | str) -> str | None:
    """The access token of a claude.ai login's credentials file, or None."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        token = json.loads(Path(path).read_text()).get("claudeAiOauth", {}).get("accessToken")
        return token if isinstance(token, str) and token else None
    return None


def start_gateway(session: Path, script: str, budget: float | None, listen: str = LOOPBACK) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start the tree's gateway and hand it the real credential on its stdin; remove the credential from this process.

    The sockets are bound and listening here, and handed to `spawn.py _gateway
    SESSION` open: the root's CLI starts at once, beside the gateway's own
    start, and its first call waits in the listen backlog if it comes first.
    It serves while a root of the session runs (the runner that started it
    stops it at its end when no other root runs); one that dies at start ends
    the tree as one that dies later does (the runner's gateway_watch).
    Returns (the gateway, where its credential came from), or (None, why not).
    """
    import psutil

    credential, source = real_credential(os.environ)
    if not credential:
        return None, source
    upstream = os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_UPSTREAM
    env = {k: v for k, v in os.environ.items() if k not in REAL_CREDENTIAL_VARS}
    try:
        sock, control, url = gateway_sockets(session, listen)
    except OSError as exc:
        return None, f"the tree's gateway could not listen on {listen}: {exc.strerror or exc}"
    fds = {"listen_fd": sock.fileno(), "control_fd": control.fileno()}
    handed = {"credential": credential, "upstream": upstream, "budget": budget, "url": url, **fds}
    try:
        # Its own process group, outside the tree's cgroup (started before the root enters it): the session's
        # other roots may still need it when this root's tree ends, and it ends when none runs (exit_with_session).
        proc = subprocess.Popen(
            [sys.executable, script, "_gateway", str(session)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            env=env, close_fds=True, pass_fds=tuple(fds.values()), start_new_session=True,
        )  # fmt: skip
        assert proc.stdin is not None
        try:
            with proc.stdin:
                proc.stdin.write(json.dumps(handed).encode() + b"\n")  # a pipe's buffer holds it: no wait for the reader
            created = psutil.Process(proc.pid).create_time()
        except (OSError, psutil.Error):
            stop_gateway(proc)
            return None, "the tree's gateway did not start"
    except OSError as exc:
        return None, f"the tree's gateway did not start: {exc.strerror or exc}"
    finally:
        sock.close()  # the gateway's now: a call to a gateway that died is refused, not left waiting
        control.close()
    write_gateway_record(session, url, proc.pid, created)
    forget_real_credential()
    return proc, source


def gateway_sockets(session: Path, listen: str) -> tuple[Any, Any, str]:
    """The gateway's listening sockets, for calls (TCP on listen) and for `budget` changes (gateway/control.sock),
    and its URL. Listening from the start, so nothing that finds the record is refused while the gateway starts."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((listen, 0))
        sock.listen(1024)
        folder = session / GATEWAY_DIR
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (folder / CONTROL_SOCKET).unlink()  # a gateway's before this one (a resumed tree)
        control = bind_private_socket(folder / CONTROL_SOCKET)
        control.listen(64)
    except OSError:
        sock.close()
        raise
    return sock, control, f"http://{listen}:{sock.getsockname()[1]}"


def write_gateway_record(session: Path, url: str, pid: int, create_time: float) -> None:
    with session_lock(session):
        write_json_atomic(session / GATEWAY_DIR / GATEWAY_RECORD, {"url": url, "pid": pid, "create_time": create_time})


def remove_gateway_traces(session: Path, pid: int) -> None:
    """The record and control socket of the gateway pid, when they are still its own (a stopped gateway's)."""
    folder = session / GATEWAY_DIR
    try:
        ours = read_json(folder / GATEWAY_RECORD).get("pid") == pid
    except Exception:  # no record, or none that can be read: nothing here is known to be its
        ours = False
    if ours:
        with contextlib.suppress(OSError):
            (folder / GATEWAY_RECORD).unlink()
        with contextlib.suppress(OSError):
            (folder / CONTROL_SOCKET).unlink()


def forget_real_credential() -> None:
    """Take the real credential out of this process's environment: the tree's gateway holds it, and the CLIs
    this process starts inherit what is left."""
    for name in REAL_CREDENTIAL_VARS:
        os.environ.pop(name, None)


def stop_gateway(proc: subprocess.Popen[bytes] | None, session: Path | None = None) -> None:
    """End the gateway (at once when no call is in flight, else once those are answered), and its traces in session."""
    if proc is None:
        return
    # Our own child, not yet reaped: Supervised's stop path, as every signal spawn.py sends.
    Supervised.signal_pid(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        Supervised.signal_pid(proc.pid, signal.SIGKILL)
        proc.wait()
    if session is not None:
        remove_gateway_traces(session, proc.pid)  # a gateway killed, or ended before it served, left them


# ------------------------------------------------------ the gateway itself --


@dataclass
class Inflight:
    """The calls the gateway is forwarding now (a docstring also spares dataclasses an import of inspect)."""

    count: int = 0
    reserved: float = 0.0


@dataclass
class Head:
    """A cacheable head's state: until when the cache holds it, and the call writing it (its event is set when
    that call starts answering or ends)."""

    fresh_until: float = 0.0
    writer: Any = None
    """The writing call's asyncio.Event, None while no call writes it."""


@dataclass
class HeadTurn:
    """One call's part in its head's stagger: its head, that head's TTL, and its event if it is the writer."""

    key: str
    ttl: float
    writer: Any = None


class Gateway:
    """The state of the running gateway: who is asking, what their calls hold, the ledger they are charged to."""

    def __init__(
        self, session: Path, credential: Mapping[str, str], upstream: str, environ: Mapping[str, str], budget: float | None = None
    ) -> None:
        self.session = session
        self.initial_budget = budget
        """The tree's budget as its root began it (handed on the pipe, not read from limits.json, which anyone may write)."""
        self.key = os.urandom(32)
        """The MAC key of the gateway's own ledger lines: in this process's memory only."""
        # The lines already there were the tree's before this gateway (a resumed tree's, its gateway then).
        self.earlier = {canonical_digest(e) for e in ledger_entries(ledger_lines(session))}
        self.credential = dict(credential)
        self.upstream = upstream.rstrip("/")
        self.table = price_table(environ)
        self.inflight: dict[str, Inflight] = {}
        """By the agent that asks (an in-process agent's calls are also counted to its holder's)."""
        self.records: dict[str, dict[str, Any]] = {}
        self.metas: dict[str, tuple[int, dict[str, Any]]] = {}
        self.ledger = LedgerTail(session, accept=self.trusted)
        self.client: Any = None
        self.not_before = 0.0
        """Monotonic time before which no call goes upstream: the last rate limit's retry-after, for the tree."""
        self.max_calls = call_cap(environ)
        self.slots: Any = None
        """With a cap, the asyncio.Semaphore each model call holds while it is upstream (made in the loop)."""
        self.stagger_s = stagger_limit(environ)
        self.heads: dict[str, Head] = {}
        """By cache_head's digest: whether the head is in the prompt cache, and who is writing it."""
        self.serving = 0
        """HTTP requests being answered now: a SIGTERM when there are none ends the gateway at once."""

    def record(self, *parts: str) -> dict[str, Any]:
        """A record of the session that never changes once written (a credential's, a subagent's), read once."""
        key = "/".join(parts)
        if key not in self.records:
            with contextlib.suppress(OSError, ValueError, Exception):
                found = read_json(self.session.joinpath(*parts))
                if isinstance(found, dict):
                    self.records[key] = found
        return self.records.get(key, {})

    def agent_of(self, headers: Mapping[str, str]) -> tuple[str, str] | None:
        """(whose hold pays: the credential's agent, the agent that asks: an in-process agent of its CLI, else the same)."""
        value = headers.get("x-api-key") or ""
        if not value and headers.get("authorization", "").lower().startswith("bearer "):
            value = headers["authorization"][7:]
        if not value:
            return None
        holder = self.record(GATEWAY_DIR, CREDENTIALS_DIR, credential_digest(value)).get("id")
        if not isinstance(holder, str):
            return None
        native = headers.get(AGENT_ID_HEADER, "")
        if plain_name(native):
            agent = self.record(GATEWAY_DIR, SUBAGENTS_DIR, holder, native).get("id")
            if isinstance(agent, str):
                return holder, agent
        return holder, holder

    def meta(self, agent: str) -> dict[str, Any]:
        """The agent's meta.json, read again only when it changed (steering may move its deadline)."""
        path = self.session / "agents" / agent / "meta.json"
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return {}
        cached = self.metas.get(agent)
        if cached is None or cached[0] != stamp:
            with contextlib.suppress(OSError, ValueError, Exception):
                found = read_json(path)
                cached = (stamp, found if isinstance(found, dict) else {})
                self.metas[agent] = cached
        return cached[1] if cached is not None else {}

    def deadline(self, holder: str, agent: str) -> float | None:
        """The nearest deadline of the agent and the in-process agents above it (epoch seconds)."""
        found: list[float] = []
        for meta in self.chain(holder, agent):
            if isinstance(d := meta.get("deadline"), int | float) and not isinstance(d, bool):
                found.append(float(d))
        return min(found) if found else None

    def chain(self, holder: str, agent: str) -> list[dict[str, Any]]:
        """The metas of agent and its in-process ancestors, up to and with holder's (a loop or a gap ends it)."""
        metas: list[dict[str, Any]] = []
        cursor, seen = agent, set()
        while cursor and cursor not in seen:
            seen.add(cursor)
            meta = self.meta(cursor)
            metas.append(meta)
            if cursor == holder:
                break
            parent = meta.get("parent_id")
            cursor = parent if isinstance(parent, str) else ""
        return metas

    def budget(self) -> float | None:
        """The tree's budget (None: none): its root's, as this gateway's own budget lines changed it."""
        changed = self.ledger.read().budget
        return changed if changed is not None else self.initial_budget

    def mac(self, line: Mapping[str, Any]) -> str:
        import hmac

        return hmac.new(self.key, canonical(line).encode(), "sha256").hexdigest()

    def sign(self, line: Mapping[str, Any]) -> dict[str, Any]:
        """A ledger line of this gateway's, with its MAC."""
        return {**line, MAC: self.mac(line)}

    def trusted(self, entry: Mapping[str, Any]) -> bool:
        """Whether the gateway believes a ledger line: one that decides money only if it wrote it."""
        kind, mac = entry.get("kind"), entry.get(MAC)
        if mac is None and kind not in SIGNED_KINDS and not (kind == "reserve" and "topped_up_usd" in entry):
            return True  # an admission's hold, a runner's charge: checked by what they can move (ledger.overdrawn)
        import hmac

        return (isinstance(mac, str) and hmac.compare_digest(mac, self.mac(entry))) or canonical_digest(entry) in self.earlier

    def room(self, holder: str) -> float | None:
        """USD the holder may still commit to: its hold less what its CLI spent (its in-process agents' calls too),
        its children's holds and its calls in flight; None: no tree budget, or no hold to keep."""
        if self.budget() is None:
            return None
        ledger = self.ledger.read()
        if not ledger.live(holder):
            return None if holder not in ledger.holds else 0.0
        return ledger.free(holder, 0.0, ledger.spend_of(holder)) - self.inflight.get(holder, Inflight()).reserved

    def tree_cgroups(self) -> list[Path]:
        """The cgroups of the session's trees: each root's, where it has one."""
        found = []
        for folder in session_roots(self.session):
            with contextlib.suppress(OSError, SpawnError):
                if (cgroup := owned_cgroup(load_meta(folder))) is not None:
                    found.append(cgroup)
        return found

    def overdrawn(self, holder: str) -> str | None:
        """Why the holds above holder's may not be believed (ledger.overdrawn), or None."""
        budget, ledger = self.budget(), self.ledger.read()
        return overdrawn(ledger, holder, budget) if budget is not None and ledger.live(holder) else None

    def own_room(self, holder: str, agent: str) -> float | None:
        """For an in-process agent: what its own max_budget_usd, and its in-process ancestors', leave; None: none set."""
        if agent == holder:
            return None
        ledger: LedgerState | None = None
        rooms: list[float] = []
        for meta in self.chain(holder, agent)[:-1]:
            own = ledger_usd(meta.get("max_budget_usd"))
            if own is None or not isinstance(meta.get("id"), str):
                continue
            ledger = ledger or self.ledger.read()
            below = self.below(holder, meta["id"], ledger.hosted)
            spent = sum(ledger.spends.get(i, 0.0) for i in below)
            rooms.append(own - spent - sum(self.inflight.get(i, Inflight()).reserved for i in below))
        return min(rooms) if rooms else None

    def below(self, holder: str, agent: str, hosted: Mapping[str, str]) -> list[str]:
        """agent and the in-process agents below it that have spent (their in-process ancestors name it)."""
        return [agent, *(o for o in hosted if o != agent and any(m.get("id") == agent for m in self.chain(holder, o)))]

    def upstream_headers(self, headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
        drop = {"host", "x-api-key", "authorization", "content-length", "connection", "accept-encoding"}
        out = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.decode("latin-1").lower() not in drop}
        if self.credential.get("ANTHROPIC_API_KEY"):
            out["x-api-key"] = self.credential["ANTHROPIC_API_KEY"]
        elif self.credential.get("ANTHROPIC_AUTH_TOKEN"):
            out["authorization"] = f"Bearer {self.credential['ANTHROPIC_AUTH_TOKEN']}"
        elif self.credential.get(OAUTH):
            out["authorization"] = f"Bearer {self.oauth()}"
            betas = [b.strip() for k, v in out.items() if k.lower() == "anthropic-beta" for b in v.split(",") if b.strip()]
            out = {k: v for k, v in out.items() if k.lower() != "anthropic-beta"}
            out["anthropic-beta"] = ",".join([*betas, *([] if OAUTH_BETA in betas else [OAUTH_BETA])])
        out["accept-encoding"] = "identity"  # the meter reads the bytes as they pass
        return out

    def oauth(self) -> str:
        """The login's access token: read again from its file when that changed (the user's CLI refreshed it)."""
        path = self.credential.get("oauth_file")
        if path:
            with contextlib.suppress(OSError):
                stamp = str(os.stat(path).st_mtime_ns)
                if stamp != self.credential.get("oauth_stamp"):
                    self.credential["oauth_stamp"] = stamp
                    self.credential[OAUTH] = oauth_token(path) or self.credential[OAUTH]
        return self.credential[OAUTH]

    def charge(self, agent: str, model: str, call: Call) -> None:
        usage = call.meter.served()
        line = {
            "id": agent,
            "host": call.holder if call.holder != agent else None,
            "time": utc_now_iso(),
            "kind": "spend",
            "cost_usd": round_usd(price_usage(model, usage, self.table)) or 0.0,
            "usage": token_usage(usage),
            "model": model,
            "ttfb_s": round(call.ttfb, 3) if call.ttfb is not None else None,
            "duration_s": round(time.monotonic() - call.started, 3),
            "status": call.status,
        }
        append_ledger(self.session, self.sign({k: v for k, v in line.items() if v is not None}), [])

    def refuse(self, agent: str, reason: str) -> None:
        append_ledger(self.session, self.sign({"id": agent, "time": utc_now_iso(), "kind": "refused", "reason": reason}), [])


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def send_json(send: Any, status: int, payload: Mapping[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


def api_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": f"spawn.py gateway: {message}"}}


def draw_raise(gw: Gateway, agent: str, room: float, whole: float, minimum: float) -> bool:
    """Grow the agent's hold from what `budget` raised that no hold drew yet: by what the whole request needs, else its least."""
    for need in (whole, minimum):
        if need > room and top_up_hold(gw.session, agent, max(0.01, math.ceil((need - room) * 1e6) / 1e6), [], gw) is not None:
            return True
    return False


async def wait_for_room(gw: Gateway, holder: str, agent: str, need: float, whole: float) -> bool:
    """Under pause: hold the request (no upstream call) until a raise grows the holder's hold to cover it.

    The agent that asked (an in-process agent of the holder's CLI, or the holder) is the one paused.
    """
    import asyncio

    paused = Path(gw.session) / "agents" / agent / "paused.json"
    ledger = gw.ledger.read()
    hold = ledger.holds.get(holder, (None, 0.0))[1]
    room = gw.room(holder)
    record = {
        "id": agent,
        "since": utc_now_iso(),
        "reason": "budget: its hold can't pay for its next model request; the gateway holds the request until a raise covers it",
        "spent_usd": round_usd(ledger.spend_of(holder)) or 0.0,
        "hold_usd": round_usd(hold) or 0.0,
        "needed_usd": max(0.01, math.ceil((need - (room or 0.0)) * 1e6) / 1e6),
    }
    with contextlib.suppress(OSError):
        write_json_atomic(paused, record)
    try:
        while True:
            room = gw.room(holder)
            if room is None or room + 1e-9 >= need:
                return True
            if not await asyncio.to_thread(draw_raise, gw, holder, room, whole, need):
                await asyncio.sleep(GATEWAY_PAUSE_POLL_S)
    finally:
        with contextlib.suppress(OSError):
            paused.unlink()


async def handle(gw: Gateway, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
    """One request: the settle call of a runner, or an agent's call, held to its hold, passed through and charged."""
    import asyncio

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if scope["path"] == "/_spawn/settle":
        await settle(gw, scope, send)
        return
    # Records read once and the ledger's tail: cheap enough for the loop itself, and a thread hop per call is not.
    who = gw.agent_of(headers)
    body = await read_body(receive)
    if who is None:
        await send_json(send, 401, api_error("authentication_error", "this credential is no agent's of this tree"))
        return
    holder, agent = who
    metered = scope["path"].rstrip("/") == "/v1/messages" and scope["method"] == "POST"
    request = parse_object(body) if metered else {}  # once: a CLI's request is tens of kilobytes of JSON
    deadline = gw.deadline(holder, agent) if metered else None
    if deadline is not None and time.time() >= deadline:
        await refuse_call(gw, agent, f"deadline: agent {agent}'s deadline has passed", send)
        return
    reserved = 0.0
    if metered:
        held = await hold_request(gw, holder, agent, body, request, send=send)
        if held is None:
            return
        body, reserved = held
    call = Call(agent, reserved, time.monotonic(), holder=holder, deadline=deadline)
    counted = [gw.inflight.setdefault(a, Inflight()) for a in {holder, agent}]
    for inflight in counted:
        inflight.count += 1
        inflight.reserved += reserved
    turn: HeadTurn | None = None
    try:
        if metered:
            turn = await stagger(gw, request, deadline)  # before a slot is taken: a call waiting here holds none
            send = answer_watch(gw, turn, send)
            call.started = time.monotonic()  # its ttfb is the model's, as under the cap
        if metered and gw.slots is not None:
            async with gw.slots:  # the tree's cap on calls at once: the rest wait here, with no upstream call
                call.started = time.monotonic()
                await forward(gw, scope, body, call, receive=receive, send=send)
        else:
            await forward(gw, scope, body, call, receive=receive, send=send)
    finally:
        head_released(gw, turn)
        try:
            if metered and call.meter.usage:
                model = call.meter.model or str(request.get("model") or "")
                await asyncio.to_thread(gw.charge, agent, model, call)
        finally:
            # Only once its charge is in the ledger: its caller has the whole answer and may ask
            # again at once, and until then the reservation stands for what it cost.
            for inflight in counted:
                inflight.count -= 1
                inflight.reserved -= reserved


async def stagger(gw: Gateway, request: Mapping[str, Any], deadline: float | None) -> HeadTurn | None:
    """Hold a call while another call writes its cacheable head to the prompt cache, until that one starts answering.

    Then it reads the head at a tenth of the price instead of writing it again at 1.25 times: a fan-out's
    leaves, sent at once, would otherwise all write it. The wait is bounded by SPAWN_GATEWAY_STAGGER_S and the
    agent's deadline; a writer that fails or ends hands the role on (the waiters decide again). Once a head
    has been answered, its calls go straight through for its TTL. Returns the call's turn (None: no head).
    """
    import asyncio

    head = cache_head(request) if gw.stagger_s > 0 else None
    if head is None:
        return None
    key, ttl = head
    limit = time.monotonic() + gw.stagger_s
    if deadline is not None:
        limit = min(limit, time.monotonic() + max(0.0, deadline - time.time()))
    while True:
        if key not in gw.heads and len(gw.heads) >= STAGGER_HEADS_KEPT:
            now = time.monotonic()
            gw.heads = {k: h for k, h in gw.heads.items() if h.writer is not None or h.fresh_until > now}
        state = gw.heads.setdefault(key, Head())
        role = stagger_role(time.monotonic(), state.fresh_until, state.writer is not None)
        if role == "read":
            return HeadTurn(key, ttl)
        if role == "write":
            state.writer = asyncio.Event()
            return HeadTurn(key, ttl, state.writer)
        left = limit - time.monotonic()
        if left <= 0:
            return HeadTurn(key, ttl)  # waited its share: it goes, and writes the head too if it must
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.writer.wait(), left)


def head_answered(gw: Gateway, turn: HeadTurn) -> None:
    """The call started answering: its head is in the cache (a read keeps it there too) for its TTL."""
    state = gw.heads.setdefault(turn.key, Head())
    state.fresh_until = max(state.fresh_until, time.monotonic() + turn.ttl)
    head_released(gw, turn)


def head_released(gw: Gateway, turn: HeadTurn | None) -> None:
    """The writer answered or ended: wake the calls waiting on it (each decides again)."""
    if turn is None or turn.writer is None:
        return
    state = gw.heads.get(turn.key)
    if state is not None and state.writer is turn.writer:
        state.writer = None
    turn.writer.set()
    turn.writer = None


def answer_watch(gw: Gateway, turn: HeadTurn | None, send: Any) -> Any:
    """send, noting the first bytes of a 200 answer (head_answered): the prompt cache holds the head from then on."""
    if turn is None:
        return send
    status = [0]

    async def watched(message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = int(message.get("status") or 0)
        elif status[0] == 200 and message.get("body"):
            status[0] = -1  # once
            head_answered(gw, turn)
        await send(message)

    return watched


async def settle(gw: Gateway, scope: Mapping[str, Any], send: Any) -> None:
    """A runner's wait for its agent's calls in flight to end and be charged (its CLI has ended)."""
    import asyncio

    query = dict(p.split("=", 1) for p in scope["query_string"].decode().split("&") if "=" in p)
    agent = query.get("agent", "")
    limit = time.monotonic() + SETTLE_WAIT_S
    while gw.inflight.get(agent, Inflight()).count and time.monotonic() < limit:
        await asyncio.sleep(0.05)
    await send_json(send, 200, {"settled": not gw.inflight.get(agent, Inflight()).count})


def parse_object(body: bytes) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        parsed = json.loads(body) if body else {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


async def refuse_call(gw: Gateway, agent: str, why: str, send: Any) -> None:
    """Refuse an agent's model call: a `refused` ledger line (its outcome's reason), and a 403 the CLI does not retry."""
    import asyncio

    await asyncio.to_thread(gw.refuse, agent, why)
    await send_json(send, 403, api_error("permission_error", why))


def tighter(room: float | None, own: float | None) -> float | None:
    return min(r for r in (room, own) if r is not None) if room is not None or own is not None else None


async def hold_request(
    gw: Gateway, holder: str, agent: str, body: bytes, request: dict[str, Any], *, send: Any
) -> tuple[bytes, float] | None:
    """(the body to forward, what it holds of the agent's room), or None once refused (the answer is sent).

    The room is the holder's hold's (the process agent whose credential it
    carried), and for an in-process agent also its own budget's. A raise grows
    the hold, never an agent's own budget: a call short of that is refused.
    The last decision is made with no await before its caller counts the
    reservation, so two calls of one agent never both take the same room.
    """
    import asyncio

    model = str(request.get("model") or "")
    max_tokens = request.get("max_tokens") if isinstance(request.get("max_tokens"), int) else None
    _, whole = hold_plan(math.inf, len(body), model, max_tokens, gw.table)
    price_in, price_out = family_prices(model, gw.table)
    # The least hold_plan grants, and a micro-dollar more: so that a room this big surely grants it.
    minimum = input_ceiling(len(body), price_in) + MIN_OUTPUT_TOKENS * price_out / 1e6 + 1e-6
    drawn = False
    while True:
        room, own = gw.room(holder), gw.own_room(holder, agent)
        if room is not None and (forged := gw.overdrawn(holder)) is not None:
            why = f"budget: {forged}, so no call below it is granted (a hold grows only by admission or a raise)"
            await refuse_call(gw, agent, why, send)
            return None
        left = tighter(room, own)
        if left is None:
            return body, 0.0
        granted, reserved = hold_plan(left, len(body), model, max_tokens, gw.table)
        held_by_hold = room is not None and (own is None or room <= own)
        if granted is not None and (max_tokens is None or granted >= max_tokens):
            break
        if gw.inflight.get(holder, Inflight()).count:
            # Its agent's own calls in flight hold what it lacks (a CLI asks its side questions beside
            # its turn, each reserving up to its max_tokens): wait for their charges before cutting or refusing.
            await asyncio.sleep(GATEWAY_INFLIGHT_POLL_S)
            continue
        if not held_by_hold:
            break
        if not drawn:
            drawn = True
            # Short of the whole request: a raise not yet drawn pays for it, at once (as under pause).
            # Decided again after it either way: other calls may have taken room while it ran.
            await asyncio.to_thread(draw_raise, gw, holder, left, whole, minimum)
            continue
        if granted is None and gw.meta(holder).get("on_budget") == "pause":
            await wait_for_room(gw, holder, agent, minimum, whole)
            continue
        break
    if granted is None:
        whose = "hold" if held_by_hold else "own budget"
        why = f"budget: agent {agent}'s {whose} has ${max(left, 0.0):.4f} left, less than its next model request can cost (${reserved:.4f})"
        await refuse_call(gw, agent, why, send)
        return None
    if granted != max_tokens:
        request["max_tokens"] = granted
        body = json.dumps(request).encode()
    return body, reserved


@dataclass
class Call:
    """One model call in flight: whose, what it holds, and what its answer has said so far."""

    agent: str
    reserved: float
    started: float
    holder: str = ""
    """Whose hold pays: the agent whose credential the call carried."""
    deadline: float | None = None
    """Epoch seconds at which a stream still running is ended."""
    meter: StreamMeter = field(default_factory=StreamMeter)
    ttfb: float | None = None
    status: str = "error"


async def forward(gw: Gateway, scope: Mapping[str, Any], body: bytes, call: Call, *, receive: Any, send: Any) -> None:
    """Pass the call upstream and its answer back, chunk by chunk as it comes; stop when the caller leaves."""
    import asyncio

    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    response = None
    try:
        response = await send_upstream(gw, scope, body, gone)
        if response is None:
            await send_json(send, 502, api_error("api_error", "upstream unreachable"))
            return
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        dropped = ("content-length", "transfer-encoding", "connection", "content-encoding")
        out_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items() if k.lower() not in dropped]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out_headers})
        call.status = "cut"
        whole = b""
        left = None if call.deadline is None else max(0.0, call.deadline - time.time())
        try:
            # A stream still running at the agent's deadline is ended there (the connection drops).
            async with asyncio.timeout(left):
                async for chunk in response.aiter_raw():
                    if call.ttfb is None:
                        call.ttfb = time.monotonic() - call.started
                    if is_sse:
                        call.meter.feed_sse(chunk)
                    else:
                        whole += chunk
                    if gone.is_set():
                        break
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    call.status = str(response.status_code)
                    await send({"type": "http.response.body", "body": b""})
        except TimeoutError:
            call.status = "deadline"
        if not is_sse and response.status_code == 200:
            call.meter.feed_json(whole)
    finally:
        watcher.cancel()
        if response is not None:
            await response.aclose()


async def send_upstream(gw: Gateway, scope: Mapping[str, Any], body: bytes, gone: Any) -> Any:
    """The upstream response, once it is not a rate limit (429) or an overload (529); None when unreachable.

    Such an answer is the tree's, not the caller's: its retry-after (else a
    backoff) holds every call of the tree, and the call is sent again when it
    passes, so each CLI waits instead of hammering, and none sees a 529 (the
    CLI gives up after its third).
    """
    import asyncio

    path = scope["path"] + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
    headers = gw.upstream_headers(scope["headers"])
    for attempt in range(RATE_RETRIES + 1):
        while (wait := gw.not_before - time.monotonic()) > 0:
            await asyncio.sleep(min(wait, GATEWAY_PAUSE_POLL_S))
        try:
            if isinstance(gw.client, Upstream):
                response = await gw.client.send(scope["method"], path, headers, body)
            else:  # httpx, through the environment's proxy
                request = gw.client.build_request(scope["method"], gw.upstream + path, headers=headers, content=body)
                response = await gw.client.send(request, stream=True)
        except Exception:
            return None
        if response.status_code not in (429, 529) or attempt == RATE_RETRIES or gone.is_set():
            return response
        await response.aclose()
        delay = float_or_none(response.headers.get("retry-after")) or min(RATE_BACKOFF_MAX_S, 2.0**attempt)
        gw.not_before = max(gw.not_before, time.monotonic() + delay)
    return None


# ------------------------------------------------ a change of the budget --


def change_budget_at_gateway(
    session: Path, raise_usd: float | None, set_usd: float | None, by: str, at_most: float | None
) -> dict[str, Any] | None:
    """Ask the tree's gateway to change its budget (`spawn.py budget`); its answer, or None for a tree without one.

    The answer is {"max_budget_usd", "previous_usd"}, or {"error": "usage"|"refused", "message"}.
    """
    import socket

    if gateway_url(session) is None:
        return None
    path = session / GATEWAY_DIR / CONTROL_SOCKET
    address, dir_fd = unix_address(str(path))
    request = {"raise_usd": raise_usd, "set_usd": set_usd, "by": by, "at_most": at_most}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(CONTROL_READ_S * 2)
            try:
                client.connect(address)
            except (FileNotFoundError, ConnectionRefusedError):
                # Its tree has ended (a gateway killed with its tree leaves its record): the ledger is
                # the budget's record again. Not its pid's liveness: a caller in another pid namespace can't see it.
                return None
            client.sendall(json.dumps(request).encode() + b"\n")
            answer = json.loads(read_line(client, CONTROL_MAX_BYTES, CONTROL_READ_S * 2))
    except (OSError, ValueError) as exc:
        return {"error": "state", "message": f"the tree's gateway did not take the change ({exc}); is the tree still running?"}
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return answer if isinstance(answer, dict) else {"error": "state", "message": "the tree's gateway answered nonsense"}


def control_answer(gw: Gateway, peer: Any, line: bytes) -> dict[str, Any]:
    """The gateway's answer to a budget change on its control socket, from a caller the kernel named (peer).

    A caller that runs under an agent of this tree is refused, as `spawn.py
    budget` refuses it, but here by the gateway itself: a raise reaches the
    holds only through here, so no agent can pay itself more, whatever it writes.
    """
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError(line)
        by = str(request.get("by") or "someone")[:200]
        numbers = [request.get(k) for k in ("raise_usd", "set_usd", "at_most")]
        raise_usd, set_usd, at_most = (ledger_usd(n) if n is not None else None for n in numbers)
        if any(n is not None and v is None for n, v in zip(numbers, (raise_usd, set_usd, at_most), strict=True)):
            return {"error": "usage", "message": "give a non-negative number of USD"}
        if (raise_usd is None) == (set_usd is None):
            return {"error": "usage", "message": "give one of --raise and --set"}
    except ValueError:
        return {"error": "usage", "message": "a change of the budget is one JSON line: {raise_usd|set_usd, by, at_most}"}
    refusal = "the caller is another user's process, or gone" if peer is None else tree_caller_refusal(gw.session, calling_agents(peer))
    if refusal is None and (tree := in_tree_cgroup(peer.pid, gw.tree_cgroups())) is not None:
        # Its ancestry as this process sees it can hide nothing (SO_PEERCRED's pid is ours to walk), but
        # a process can leave it (handed to a daemon of the user's); it can't leave the tree's cgroup.
        refusal = f"process {peer.pid} runs in this tree's cgroup ({tree}) and can't change its budget; the person or a client outside can"
    if refusal is not None:
        with contextlib.suppress(OSError):
            record_budget_refusal(gw.session, by, refusal, [])
        return {"error": "refused", "message": f"refused: {refusal}"}
    try:
        change = append_budget_change(gw.session, raise_usd, set_usd, by, [], at_most=at_most, authority=gw)
    except (UsageError, RefusedError) as exc:
        return {"error": "refused" if isinstance(exc, RefusedError) else "usage", "message": exc.message}
    return {"max_budget_usd": change.max_budget_usd, "previous_usd": change.previous_usd}


async def serve_control(gw: Gateway, reader: Any, writer: Any) -> None:
    """One connection to the control socket: one change, one answer."""
    import asyncio

    try:
        peer = peer_process(writer.get_extra_info("socket"))
        line = await asyncio.wait_for(reader.readline(), CONTROL_READ_S)
        answer = await asyncio.to_thread(control_answer, gw, peer, line[:CONTROL_MAX_BYTES])
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
    except (OSError, TimeoutError, ValueError):
        pass
    finally:
        writer.close()


async def exit_with_session(server: Any, session: Path) -> None:
    """The gateway lives as long as a root of its session runs: once none does (each ended, or its runner
    was SIGKILLed), no call is served. A session an MCP server shares has several roots, each started
    and ended on its own, and the first one's end must not take the others' gateway with it."""
    import asyncio

    parent = os.getppid()  # the root's runner that started it (or a bench): it serves while that runs, too
    while os.getppid() == parent or roots_running(session):
        await asyncio.sleep(GATEWAY_PAUSE_POLL_S)
    server.should_exit = True


def serve_gateway(session: Path) -> int:
    """`spawn.py _gateway SESSION`: read the credential (and the sockets it was handed) from stdin, serve until SIGTERM.

    Started by a root's runner, it is handed its sockets, listening, and the
    runner writes its record. Started alone (a bench), it binds them on
    loopback unless told, writes its record and prints its URL.
    """
    import asyncio
    import socket

    def leave_at_once(*_: Any) -> None:
        """SIGTERM with no call in flight: nothing is left to answer or charge (each charge is in the ledger)."""
        remove_gateway_traces(session, os.getpid())
        sys.stderr.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, leave_at_once)  # a tree that ends as its gateway starts waits for no import
    handed = json.loads(sys.stdin.readline() or "{}")
    sys.stdin.close()
    if isinstance(handed.get("listen_fd"), int) and isinstance(handed.get("control_fd"), int):
        sock, control_sock, url = socket.socket(fileno=handed["listen_fd"]), socket.socket(fileno=handed["control_fd"]), str(handed["url"])
    else:
        import psutil

        sock, control_sock, url = gateway_sockets(session, str(handed.get("listen") or LOOPBACK))
        write_gateway_record(session, url, os.getpid(), psutil.Process().create_time())
    sys.stdout.write(url + "\n")
    sys.stdout.flush()

    import uvicorn

    gw = Gateway(
        session, handed.get("credential") or {}, handed.get("upstream") or DEFAULT_UPSTREAM, os.environ, ledger_usd(handed.get("budget"))
    )

    async def app(scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            gw.serving += 1
            try:
                await handle(gw, scope, receive, send)
            finally:
                gw.serving -= 1

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not gw.serving:
                leave_at_once()  # uvicorn's graceful shutdown takes 0.1-0.2 s, on the root's way out
            super().handle_exit(sig, frame)

    async def main() -> None:
        gw.slots = asyncio.Semaphore(gw.max_calls) if gw.max_calls else None
        if proxied(gw.upstream, os.environ):
            import httpx

            gw.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=httpx.Limits(max_connections=None))
        else:
            gw.client = Upstream(gw.upstream, os.environ)
        server = Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        control = await asyncio.start_unix_server(lambda r, w: serve_control(gw, r, w), sock=control_sock)
        orphaned = asyncio.ensure_future(exit_with_session(server, session))
        # uvicorn raises the signal that stopped it again once it has stopped, with the handler it
        # found: SIGTERM's is leave_at_once; SIGINT's default would end this process before it
        # removes its record and socket.
        signal.signal(signal.SIGINT, lambda *_: None)
        try:
            await server.serve(sockets=[sock])
        finally:
            remove_gateway_traces(session, os.getpid())
            control.close()
            orphaned.cancel()
            await gw.client.aclose()

    asyncio.run(main())
    return 0
