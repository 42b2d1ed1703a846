"""One frozen configuration per process, built from farm.toml and command-line flags.

Nothing else in farmd reads the environment or a config file: entry points build a
``Config`` once (``load``) and hand it down.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from farmd.errors import ConfigError
from farmd.sandbox.config import SandboxConfig
from farmd.scheduler.scheduler import SchedulerConfig

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
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus metrics over HTTP (None: off; port 0: any free port)."""


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
    if "demand_envs" in table:
        table = {**table, "demand_envs": tuple(table["demand_envs"])}
    try:
        return SchedulerConfig(**table)
    except TypeError as exc:
        raise ConfigError(f"[scheduler]: {exc}") from exc


def load(path: Path | None = None, **flags: Any) -> Config:
    """Build the config: defaults, then ``path`` (TOML), then FARM_TOKEN, then non-None ``flags``."""
    values: dict[str, Any] = {}
    sandbox = SandboxConfig()
    scheduler = SchedulerConfig()
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
        if raw:
            raise ConfigError(f"{path}: unknown tables {sorted(raw)}; expected [farm], [sandbox] and [scheduler]")
        known = {f.name for f in fields(Config)} - {"sandbox", "scheduler"}
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
    return Config(sandbox=sandbox, scheduler=scheduler, **values)
