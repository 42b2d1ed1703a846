"""One frozen configuration per process, built from farm.toml and command-line flags.

Nothing else in farmd reads the environment or a config file: entry points build a
``Config`` once (``load``) and hand it down. That includes the API keys of model endpoints
(``[endpoints.NAME] key_env``), read here when the config loads and nowhere else, and the tokens of
``[[credentials]] token_file``.

Credentials keep a token's sha256, never the token, and no repr, log line or error shows either.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from farmd.atropos.settings import AtroposConfig
from farmd.errors import AgentSpecError, ConfigError
from farmd.intake.settings import IntakeConfig
from farmd.sandbox.config import SandboxConfig
from farmd.scheduler.config import SchedulerConfig
from farmd.taskbank import BankConfig, TaskBankError
from farmd.text import is_sha256

if TYPE_CHECKING:
    # Agents load environments, boxes and clients: a config that names no agent or endpoint (every farmctl
    # call against a farm, most farmd starts) is read without them, so they are imported where needed.
    from farmd.agents.registry import NamedEndpoint

T = TypeVar("T")

DEFAULT_LISTEN = "127.0.0.1:7431"

ROLES = frozenset({"operator", "trainer", "node", "contributor", "reviewer", "environment"})
"""What a credential may hold; which calls each role may make is ``farmd.api.auth``'s table."""
SHARED = "shared"
"""The name the legacy single ``token`` takes as a credential: it holds every role."""

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_CREDENTIAL_KEYS = ("name", "roles", "token_sha256", "token_file")
_TLS_KEYS = ("cert", "key", "ca")

log = logging.getLogger("farmd.config")


def token_sha256(token: str) -> str:
    """The hex sha256 of ``token``: what a credential keeps, and what a call's token is compared as."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Credential:
    """A named bearer token and the roles it holds. Only the token's sha256 is kept, and even that
    stays out of the repr: a weak legacy token could be found from its hash."""

    name: str
    """What logs and refusals show (letters, digits, '.', '_', '-'): never the token."""
    roles: frozenset[str]
    token_sha256: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"a credential's name is 1 to 64 letters, digits, '.', '_' or '-', not {self.name!r}")
        unknown = sorted(set(self.roles) - ROLES)
        if not self.roles or unknown:
            why = f"no role {unknown[0]!r}" if unknown else "no roles"
            raise ConfigError(f"credential {self.name!r} has {why}: give roles from {', '.join(sorted(ROLES))}")
        digest = self.token_sha256.lower() if isinstance(self.token_sha256, str) else ""
        if not is_sha256(digest):  # the value is not quoted: it may be a token pasted by mistake
            raise ConfigError(f"credential {self.name!r}: token_sha256 must be 64 hex digits, the sha256 of the "
                              "token (`farmctl token new` prints one)")
        object.__setattr__(self, "roles", frozenset(self.roles))
        object.__setattr__(self, "token_sha256", digest)

    @classmethod
    def from_token(cls, name: str, roles: frozenset[str], token: str) -> Credential:
        return cls(name, roles, token_sha256(token))


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    data_dir: Path = Path("farm-data")
    """Where the store and everything a farm keeps lives."""
    store: str | None = field(default=None, repr=False)
    """The store's database: None for SQLite in ``data_dir``; ``postgresql://USER@HOST/DB`` for a PostgreSQL
    server (``--store``), ``data_dir`` still holding the secret, logs and runfile. Not shown: it may hold a
    password."""
    listen: str = DEFAULT_LISTEN
    """HOST:PORT of the gRPC API (port 0: any free port)."""
    token: str | None = field(default=None, repr=False)
    """The legacy shared secret: a credential named ``shared`` holding every role (see ``credentials``)."""
    credentials: tuple[Credential, ...] = ()
    """Who may call, with which roles (``[[credentials]]``, and ``token`` as ``shared``). None at all:
    no authentication (loopback use)."""
    tls_cert: Path | None = None
    """PEM certificate (chain) the API serves TLS with; with ``tls_key``, or neither (plain TCP)."""
    tls_key: Path | None = None
    tls_ca: Path | None = None
    """PEM of the CA whose client certificates the API requires (mutual TLS): every caller needs one."""
    workers: int | None = None
    """Rollout workers on this node (None: one per core; 0: coordinator only)."""
    torch_threads: int = 1
    """torch's threads for sampling ``torch:NAME`` policies on this node. One by default: a trainer beside farmd
    on the same cores would otherwise fight it for every core. A loop in lockstep (the trainer waits while the
    farm samples, and the farm waits while it learns) can give sampling every core."""
    log_level: str = "info"
    log_format: str = "text"
    """``text`` for people, ``json`` (one object per line) for log pipelines."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    taskbank: BankConfig = field(default_factory=BankConfig)
    """How the task bank estimates pass rates, samples tasks (the band, or uniformly) and moves levels."""
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    """The intake funnel: scrutiny by trust, the LLM attacker, the prices its costs are reported in."""
    atropos: AtroposConfig = field(default_factory=AtroposConfig)
    """Which of farm's own rollouts feed the Atropos queue (``[atropos]``: envs, agent, consumer, how far ahead)."""
    endpoints: tuple[NamedEndpoint, ...] = ()
    """The model servers jobs may name (``openai:MODEL@NAME``), from farm.toml's ``[endpoints.NAME]``."""
    verifiers: tuple[tuple[str, Path], ...] = ()
    """The operator's own verifiers environments, served as ``vf:NAME`` (``[verifiers]``: NAME = "path/to/dir"),
    their code run in boxes only."""
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus metrics over HTTP (None: off; port 0: any free port)."""
    atropos_listen: str | None = None
    """HOST:PORT for Atropos's HTTP API (None: off; port 0: any free port): Atropos environments push scored
    groups to it and Atropos trainers take batches from it, kept in the store."""
    sandbox_fusion_listen: str | None = None
    """HOST:PORT for SandboxFusion's HTTP API (None: off; port 0: any free port): ``/run_code`` runs each call
    in a farm box, answering in SandboxFusion's shapes (``farmd.api.sandbox_fusion``)."""
    http_listen: str | None = None
    """HOST:PORT for the web console (None: off; port 0: any free port): the same services and credentials
    as the gRPC API, over HTTP."""
    max_concurrent_calls: int = 256
    """API calls open at once (health checks and reflection aside); a trainer's stream counts for as
    long as it is open. One more is refused (RESOURCE_EXHAUSTED) before its request is read."""
    max_policy_bytes: int = 4 << 30
    """The largest policy a trainer may publish (it is kept in a file under the data directory)."""
    credential_streams: int = 64
    """Streams one credential may hold open at once: node Work streams and PublishPolicy and Submit uploads
    together (a fleet that shares one node credential needs one per node). One more is RESOURCE_EXHAUSTED."""
    credential_pending_bytes: int = 256 << 20
    """Bytes one credential's calls may hold waiting for the rest of what they started (a node's records in
    pieces, a package being uploaded), all its calls together. Past it the call that asks ends."""
    credential_pending_pieces: int = 4096
    """Unfinished pieces (records, package chunks) one credential's calls may hold at once, all together."""
    join: str | None = None
    """HOST:PORT of a coordinator (several, joined by commas: one farm's coordinators on one PostgreSQL store, of
    which one serves at a time): this node runs the worker role only, for it (``farmd serve --join``).
    Then ``token`` is the node's credential, ``tls_ca`` the CA its coordinator's certificate is checked
    against, and ``tls_cert``/``tls_key`` the certificate it shows."""
    node_name: str | None = None
    """This node's name in the fleet (default: the host name); unique among the coordinator's nodes."""
    policy_cache_bytes: int = 8 << 30
    """Policies a joined node keeps on disk (least recently used removed past this)."""

    def __post_init__(self) -> None:
        calls = self.max_concurrent_calls
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ConfigError(f"max_concurrent_calls must be a whole number of at least 1, not {calls!r}")
        threads = self.torch_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise ConfigError(f"torch_threads must be a whole number from 1 to 1024, not {threads!r}")
        if min(self.credential_streams, self.credential_pending_bytes, self.credential_pending_pieces) < 1:
            raise ConfigError("credential_streams, credential_pending_bytes and credential_pending_pieces are at least 1")
        if self.store is not None and not (isinstance(self.store, str)
                                           and self.store.startswith(("postgresql://", "postgres://"))):
            raise ConfigError("store (--store) is a postgresql://USER@HOST/DB address; leave it out for SQLite "
                              "in the data directory")
        if self.token:
            object.__setattr__(self, "credentials", _with_shared(self.credentials, self.token))
        _check_unique(self.credentials)
        if self.join is not None:
            if self.workers == 0:
                raise ConfigError("a joined node runs rollouts and nothing else: --workers 0 would leave it idle")
            if (self.tls_cert is None) != (self.tls_key is None):
                raise ConfigError("a node's client certificate needs its key: --tls-cert and --tls-key together")
            return  # a node's TLS settings are a client's: a CA alone just checks the coordinator
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs a certificate and its key together: --tls-cert and --tls-key "
                              "([tls] cert and key), or neither")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-ca ([tls] ca) checks client certificates, so it needs TLS: give --tls-cert "
                              "and --tls-key too")


def _with_shared(credentials: tuple[Credential, ...], token: str) -> tuple[Credential, ...]:
    """``credentials`` and the legacy token's, once (a config copied with ``replace`` has it already)."""
    shared = Credential.from_token(SHARED, ROLES, token)
    if shared in credentials:
        return credentials
    if any(c.name == SHARED for c in credentials):
        raise ConfigError(f"a credential is named {SHARED!r}, the name the token (--token, FARM_TOKEN) takes: "
                          "rename it, or drop the token")
    return (*credentials, shared)


def _check_unique(credentials: tuple[Credential, ...]) -> None:
    """Names are unique, and so are tokens: a call's token must name one credential."""
    by_name: set[str] = set()
    by_token: dict[str, str] = {}
    for c in credentials:
        if c.name in by_name:
            raise ConfigError(f"two credentials are named {c.name!r}: names are unique")
        by_name.add(c.name)
        if c.token_sha256 in by_token:
            raise ConfigError(f"credentials {by_token[c.token_sha256]!r} and {c.name!r} hold the same token: "
                              "give each its own")
        by_token[c.token_sha256] = c.name


def _coerce_sandbox(table: dict[str, Any]) -> SandboxConfig:
    known = {f.name: f for f in fields(SandboxConfig)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"[sandbox] has no setting {key!r}; known: {', '.join(sorted(known))}")
        if key in ("bwrap_path", "run_dir", "site_dir", "box_python"):
            value = Path(value)
        kwargs[key] = value
    return SandboxConfig(**kwargs)


def _coerce_scheduler(table: dict[str, Any]) -> SchedulerConfig:
    known = {f.name for f in fields(SchedulerConfig)}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"[scheduler] has no setting {sorted(unknown)[0]!r}; known: {', '.join(sorted(known))}")
    for key in ("demand_envs", "demand_consumers", "bank_agents"):  # TOML gives lists; the config is frozen
        if key in table:
            table = {**table, key: tuple(table[key])}
    try:
        return SchedulerConfig(**table)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[scheduler]: {exc}") from exc


def _coerce_taskbank(table: dict[str, Any]) -> BankConfig:
    known = {f.name for f in fields(BankConfig)}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"[taskbank] has no setting {sorted(unknown)[0]!r}; known: {', '.join(sorted(known))}")
    try:
        return BankConfig(**table)
    except (TypeError, TaskBankError) as exc:
        raise ConfigError(f"[taskbank]: {exc}") from exc


def _settings(name: str, kind: type[T], table: dict[str, Any]) -> T:
    """A ``[name]`` table as ``kind`` (a frozen dataclass): unknown keys refused by name, lists as tuples."""
    known = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"[{name}] has no setting {sorted(unknown)[0]!r}; known: {', '.join(sorted(known))}")
    try:
        return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[{name}]: {exc}") from exc


def _coerce_intake(table: dict[str, Any], endpoints: tuple[NamedEndpoint, ...]) -> IntakeConfig:
    intake = _settings("intake", IntakeConfig, table)
    if intake.attacker is not None:
        name = intake.attacker.rsplit("@", 1)[1]
        if name not in {e.name for e in endpoints}:
            raise ConfigError(f"[intake] attacker names endpoint {name!r}, which no [endpoints.{name}] defines")
    return intake


def _coerce_atropos(table: dict[str, Any], endpoints: tuple[NamedEndpoint, ...]) -> AtroposConfig:
    atropos = _settings("atropos", AtroposConfig, table)
    if atropos.agent:
        from farmd.agents.registry import check_spec

        try:
            check_spec(atropos.agent, endpoints=endpoints)
        except AgentSpecError as exc:
            raise ConfigError(f"[atropos] agent: {exc}") from None
    return atropos


_ENDPOINT_KEYS = ("url", "key_env", "request_timeout_s", "max_attempts", "max_tokens", "max_turns", "temperature",
                  "top_p", "seed", "stop", "logprobs", "token_ids", "n", "tools", "extra", "serves", "policy_model",
                  "sync", "weights_dir", "health_path", "health_every_s", "health_timeout_s", "health_failures",
                  "max_in_flight")


def _coerce_endpoints(table: dict[str, Any]) -> tuple[NamedEndpoint, ...]:
    from farmd.agents.registry import NamedEndpoint

    endpoints = []
    for name, settings in table.items():
        where = f"[endpoints.{name}]"
        if not isinstance(settings, dict):
            raise ConfigError(f'{where} must be a table: [endpoints.{name}] with url = "http://HOST:PORT/v1"')
        unknown = sorted(set(settings) - set(_ENDPOINT_KEYS))
        if unknown:
            raise ConfigError(f"{where} has no setting {unknown[0]!r}; known: {', '.join(_ENDPOINT_KEYS)}")
        if "url" not in settings:
            raise ConfigError(f'{where} needs a url, e.g. url = "http://127.0.0.1:8000/v1"')
        key_env = settings.get("key_env")
        api_key = None
        if key_env is not None:
            if not isinstance(key_env, str) or not key_env:
                raise ConfigError(f"{where}: key_env is the name of an environment variable, got {key_env!r}")
            api_key = os.environ.get(key_env)
            if not api_key:
                raise ConfigError(f"{where}: the environment variable {key_env} (its key_env) holds no API key")
        try:
            endpoints.append(NamedEndpoint(name=name, api_key=api_key, **settings))
        except ValueError as exc:
            why = f"the key in {key_env}: {exc}" if api_key and "API key" in str(exc) else str(exc)
            raise ConfigError(f"{where}: {why}") from None
    return tuple(endpoints)


def _read_token_file(path: Path, where: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); a warning if others may read the file."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read token_file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: token_file {path} is not text") from None
    if not token:
        raise ConfigError(f"{where}: token_file {path} is empty")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s: token_file %s is open to others (mode %o): chmod 600 it", where, path,
                    stat.S_IMODE(mode))
    return token


def _credential(entry: Any, index: int) -> Credential:
    """One ``[[credentials]]`` table: a name, roles, and a token_sha256 or a token_file."""
    where = f"[[credentials]] #{index + 1}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table with name, roles and token_sha256 (or token_file)")
    name = entry.get("name")
    if isinstance(name, str) and _NAME.fullmatch(name):
        where = f"credential {name!r}"
    unknown = sorted(set(entry) - set(_CREDENTIAL_KEYS))
    if unknown:
        raise ConfigError(f"{where} has no setting {unknown[0]!r}; known: {', '.join(_CREDENTIAL_KEYS)}")
    if name is None:
        raise ConfigError(f'{where} needs a name, e.g. name = "trainers"')
    roles = entry.get("roles")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise ConfigError(f'{where}: roles is a list, e.g. roles = ["trainer"]; from {", ".join(sorted(ROLES))}')
    if ("token_sha256" in entry) == ("token_file" in entry):
        raise ConfigError(f"{where} needs its token: token_sha256 (the sha256 of the token, as `farmctl token new` "
                          "prints) or token_file (a file holding the token), one of them")
    if "token_file" in entry:
        if not isinstance(entry["token_file"], str):
            raise ConfigError(f"{where}: token_file is a path")
        return Credential.from_token(name, frozenset(roles), _read_token_file(Path(entry["token_file"]), where))
    return Credential(name, frozenset(roles), entry["token_sha256"])


def _coerce_credentials(entries: Any) -> tuple[Credential, ...]:
    if not isinstance(entries, list):
        raise ConfigError("credentials are [[credentials]] tables, one per credential")
    return tuple(_credential(entry, i) for i, entry in enumerate(entries))


def _coerce_tls(table: Any) -> dict[str, Path]:
    """``[tls]`` cert, key and ca as the config's ``tls_*`` paths."""
    if not isinstance(table, dict):
        raise ConfigError('[tls] is a table: cert = "server.pem", key = "server.key", ca = "ca.pem"')
    unknown = sorted(set(table) - set(_TLS_KEYS))
    if unknown:
        raise ConfigError(f"[tls] has no setting {unknown[0]!r}; known: {', '.join(_TLS_KEYS)}")
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"[tls] {key} is the path of a PEM file")
    return {f"tls_{key}": Path(value) for key, value in table.items()}


def _coerce_verifiers(table: Any, base: Path) -> tuple[tuple[str, Path], ...]:
    """``[verifiers]``: NAME = directory (relative to farm.toml), each NAME served as ``vf:NAME``."""
    if not isinstance(table, dict):
        raise ConfigError("[verifiers] must be a table of NAME = \"path/to/package\"")
    out = []
    for name, where in sorted(table.items()):
        if not re.fullmatch(r"[a-z][a-z0-9-]{1,39}", name):
            raise ConfigError(f"[verifiers] {name[:60]!r}: a name is 2-40 lowercase letters, digits and '-', "
                              "starting with a letter")
        if not isinstance(where, str) or not where:
            raise ConfigError(f"[verifiers] {name}: the package's directory, as text")
        out.append((name, base / where))
    return tuple(out)


def load(path: Path | None = None, *, read_credentials: bool = True, **flags: Any) -> Config:
    """Build the config: defaults, then ``path`` (TOML), then FARM_TOKEN, then non-None ``flags``.

    ``read_credentials`` False is for a client (farmctl) that reads farm.toml for its other settings:
    ``[[credentials]]`` are passed over (their token files may be farmd's alone) and so is FARM_TOKEN,
    which is the client's own token there, not one farmd accepts.
    """
    values: dict[str, Any] = {}
    sandbox = SandboxConfig()
    scheduler = SchedulerConfig()
    taskbank = BankConfig()
    intake = IntakeConfig()
    atropos = AtroposConfig()
    endpoints: tuple[NamedEndpoint, ...] = ()
    credentials: tuple[Credential, ...] = ()
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        farm = raw.pop("farm", {})
        if "sandbox" in raw:
            sandbox = _coerce_sandbox(raw.pop("sandbox"))
        if "scheduler" in raw:
            scheduler = _coerce_scheduler(raw.pop("scheduler"))
        if "taskbank" in raw:
            taskbank = _coerce_taskbank(raw.pop("taskbank"))
        if "endpoints" in raw:
            endpoints = _coerce_endpoints(raw.pop("endpoints"))
        if "intake" in raw:
            intake = _coerce_intake(raw.pop("intake"), endpoints)
        if "atropos" in raw:
            atropos = _coerce_atropos(raw.pop("atropos"), endpoints)
        if "credentials" in raw:
            entries = raw.pop("credentials")
            credentials = _coerce_credentials(entries) if read_credentials else ()
        if "tls" in raw:
            values.update(_coerce_tls(raw.pop("tls")))
        if "verifiers" in raw:
            values["verifiers"] = _coerce_verifiers(raw.pop("verifiers"), path.parent)
        if raw:
            raise ConfigError(f"{path}: unknown tables {sorted(raw)}; expected [farm], [sandbox], [scheduler], "
                              "[taskbank], [intake], [atropos], [endpoints.NAME], [verifiers], [tls] and "
                              "[[credentials]]")
        known = {f.name for f in fields(Config)} - {"sandbox", "scheduler", "taskbank", "intake", "endpoints", "atropos",
                                                    "credentials", "verifiers",
                                                    "tls_cert", "tls_key", "tls_ca"}
        for key, value in farm.items():
            if key not in known:
                raise ConfigError(f"[farm] has no setting {key!r}; known: {', '.join(sorted(known))}")
            values[key] = Path(value) if key == "data_dir" else value
    env_token = os.environ.get("FARM_TOKEN") if read_credentials else None
    if env_token:
        values["token"] = env_token
    sched_flags = {k: flags.pop(k) for k in list(flags) if k in {f.name for f in fields(SchedulerConfig)}}
    sched_flags = {k: v for k, v in sched_flags.items() if v is not None}
    if sched_flags:
        scheduler = replace(scheduler, **sched_flags)
    for key, value in flags.items():
        if value is not None:
            values[key] = value
    if scheduler.demand_agent:
        from farmd.agents.registry import check_spec

        try:  # refused now, not by every demand-driven job
            check_spec(scheduler.demand_agent, endpoints=endpoints)
        except AgentSpecError as exc:
            raise ConfigError(f"[scheduler] demand_agent: {exc}") from None
    return Config(sandbox=sandbox, scheduler=scheduler, taskbank=taskbank, intake=intake, endpoints=endpoints,
                  credentials=credentials, atropos=atropos, **values)


def read_token_file(path: Path) -> str:
    """A token from a file (``--token-file``): what a command line would show every user of the host."""
    return _read_token_file(path, "--token-file")


def sandbox_for(config: Config, workers: int) -> SandboxConfig:
    """The sandbox a node with ``workers`` rollout slots runs: unless ``max_boxes`` is set, room for a box
    in every slot and the warm ones waiting beside them."""
    sandbox = config.sandbox
    if sandbox.max_boxes:
        return sandbox
    return replace(sandbox, max_boxes=max(sandbox.boxes, 2 * workers + 2))
