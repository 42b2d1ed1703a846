"""One frozen configuration per process, built from farm.toml and command-line flags.

Nothing else in farmd reads the environment or a config file: entry points build a
``Config`` once (``load``) and hand it down. That includes the API keys of model endpoints
(``[endpoints.NAME] key_env``), read here when the config loads and nowhere else.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from farmd.agents.registry import NamedEndpoint, check_spec
from farmd.errors import AgentSpecError, ConfigError
from farmd.sandbox.config import SandboxConfig
from farmd.scheduler.config import SchedulerConfig
from farmd.taskbank import BankConfig, TaskBankError

DEFAULT_LISTEN = "127.0.0.1:7431"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    data_dir: Path = Path("farm-data")
    """Where the store and everything a farm keeps lives."""
    listen: str = DEFAULT_LISTEN
    """HOST:PORT of the gRPC API (port 0: any free port)."""
    token: str | None = None
    """Shared secret every call must carry; None means no authentication (loopback use)."""
    workers: int | None = None
    """Rollout workers on this node (None: one per core; 0: coordinator only)."""
    log_level: str = "info"
    log_format: str = "text"
    """``text`` for people, ``json`` (one object per line) for log pipelines."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    taskbank: BankConfig = field(default_factory=BankConfig)
    """How the task bank estimates pass rates, samples tasks (the band, or uniformly) and moves levels."""
    endpoints: tuple[NamedEndpoint, ...] = ()
    """The model servers jobs may name (``openai:MODEL@NAME``), from farm.toml's ``[endpoints.NAME]``."""
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus metrics over HTTP (None: off; port 0: any free port)."""
    max_concurrent_calls: int = 256
    """API calls open at once (health checks and reflection aside); a trainer's stream counts for as
    long as it is open. One more is refused (RESOURCE_EXHAUSTED) before its request is read."""
    max_policy_bytes: int = 4 << 30
    """The largest policy a trainer may publish (it is kept in a file under the data directory)."""


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
    except TypeError as exc:
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


_ENDPOINT_KEYS = ("url", "key_env", "request_timeout_s", "max_attempts", "max_tokens", "max_turns", "temperature",
                  "top_p", "seed", "stop", "logprobs", "token_ids", "n", "tools", "extra", "serves")


def _coerce_endpoints(table: dict[str, Any]) -> tuple[NamedEndpoint, ...]:
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


def load(path: Path | None = None, **flags: Any) -> Config:
    """Build the config: defaults, then ``path`` (TOML), then FARM_TOKEN, then non-None ``flags``."""
    values: dict[str, Any] = {}
    sandbox = SandboxConfig()
    scheduler = SchedulerConfig()
    taskbank = BankConfig()
    endpoints: tuple[NamedEndpoint, ...] = ()
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
        if raw:
            raise ConfigError(f"{path}: unknown tables {sorted(raw)}; expected [farm], [sandbox], [scheduler], "
                              "[taskbank] and [endpoints.NAME]")
        known = {f.name for f in fields(Config)} - {"sandbox", "scheduler", "taskbank", "endpoints"}
        for key, value in farm.items():
            if key not in known:
                raise ConfigError(f"[farm] has no setting {key!r}; known: {', '.join(sorted(known))}")
            values[key] = Path(value) if key == "data_dir" else value
    env_token = os.environ.get("FARM_TOKEN")
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
        try:  # refused now, not by every demand-driven job
            check_spec(scheduler.demand_agent, endpoints=endpoints)
        except AgentSpecError as exc:
            raise ConfigError(f"[scheduler] demand_agent: {exc}") from None
    return Config(sandbox=sandbox, scheduler=scheduler, taskbank=taskbank, endpoints=endpoints, **values)
