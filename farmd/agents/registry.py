"""Agents by spec: the strings jobs and the CLI name a policy with.

- ``reference``: the environment's reference attempt (must pass).
- ``random`` or ``random:SEED``: a plausible wrong attempt, deterministic per task and seed.
- ``skilled:S``: a stand-in policy of skill S (a number; levels run 1..5): the reference with probability
  1 / (1 + e^(difficulty - S)), else a random attempt. A population for the task bank before a real policy.
- ``openai:MODEL@ENDPOINT``: a model behind an OpenAI-compatible chat API that farm.toml names
  ``[endpoints.ENDPOINT]`` (its ``url``, its key's environment variable ``key_env``, its request
  timeout and retries, what requests ask for (``NamedEndpoint``: ``temperature``, ``top_p``, ``seed``,
  ``stop``, ``logprobs``, ``token_ids``, ``n``, ``tools``, ``extra``) and the bounds below), e.g.
  ``openai:Qwen/Qwen2.5-7B-Instruct@vllm``.
  ``{version}`` in MODEL becomes the job's policy version. A query string may choose sampling
  options within the endpoint's bounds: ``max_tokens`` (per reply, at most the endpoint's
  ``max_tokens``), ``temperature`` (0 to 2; default the endpoint's), ``max_turns`` (replies in an
  action episode, at most the endpoint's ``max_turns``).
- ``redteam:exploit:NAME`` and ``redteam:escape:NAME``: an adversary (``farmctl redteam``) that submits the
  exploit library's attempt NAME for the task's kind, or tries escape NAME from inside its box; a query
  may carry the run's marker (``nonce``, hex), a ``canary`` and the ``farm`` port to try, and the farm's
  ``data`` dir (an absolute path) to look for. Built by the node's red team (``RedTeamFactory``, intake's),
  which farmd hands its workers: the agents stay out of this module, which sits below the exploit library.
- ``torch:NAME``: farm's own policy (``farm_client.tinylm``), sampled on this node from the version of line
  NAME the job was leased with (published with ``FarmClient.publish_policy``; a path or a URL is not a
  name). It answers submission tasks whose prompts it can read. A query string may set ``temperature``
  (0 to 2, default 1) and ``max_tokens`` (characters per completion, 1 to 1024, default 16), e.g.
  ``torch:tiny?temperature=0&max_tokens=8``. The node needs a policy source (the worker's).

Whoever may queue a job may write a spec, so a spec can never name a URL or a key, nor set a
timeout or a retry count: those would let a caller make farmd call any address (with any of
its environment variables as a bearer token) or hold a worker for hours. They live in the
config, which only the operator writes; a URL or an unknown name in a spec is refused with
the names that are configured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from farmd.agents.base import Agent
from farmd.agents.chat import ChatLimits
from farmd.agents.endpoint import (
    REQUEST_SETTINGS,
    ClientPool,
    EndpointConfig,
    OpenAIAgent,
    RequestSettings,
    check_sampling,
)
from farmd.agents.replicas import HealthConfig
from farmd.agents.scripted import RandomAgent, ReferenceAgent, SkilledAgent
from farmd.agents.torch_policy import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    PolicySource,
    TorchAgent,
    TorchRuntime,
    check_options,
)
from farmd.envs.base import VerifyContext
from farmd.envs.catalog import EnvLookup
from farmd.errors import AgentSpecError
from farmd.records import RED_TEAM_PREFIX
from farmd.text import clip

FORMS = ("reference", "random", "random:SEED", "skilled:S", "redteam:exploit|escape:NAME[?nonce=HEX&canary=PORT...]",
         "openai:MODEL@ENDPOINT[?max_tokens=N&temperature=T&max_turns=N]", "torch:NAME[?temperature=T&max_tokens=N]")
MAX_SPEC_CHARS = 500
"""A spec is stored with every job and trajectory; no honest one comes near this."""
MAX_TEMPERATURE = 2.0
"""OpenAI's own bound; past it sampling is noise."""

_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_POLICY_NAME = _ENDPOINT_NAME
"""A policy line's name, as ``torch:NAME`` says it (the scheduler's ``LINE_NAME``)."""
_SPEC_OPTIONS = ("max_tokens", "temperature", "max_turns")
_TORCH_OPTIONS = ("temperature", "max_tokens")
_CONFIG_ONLY = {"key_env": "key_env", "timeout_s": "request_timeout_s", "attempts": "max_attempts"}
_RED_TEAM_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_HEX = re.compile(r"[0-9a-f]{16,64}")

RedTeamFactory = Callable[[str, "EnvLookup | None", "VerifyContext | None"], Agent]
"""Builds a ``redteam:`` agent from its spec, the node's environment lookup and its boxes."""


@dataclass(frozen=True)
class RedTeamSpec:
    """A ``redteam:`` spec, parsed: what it tries, and the run's marker and targets."""

    what: str
    """``exploit``, ``escape`` or ``canary`` (intake's production canaries: ``farmd.intake.canaries``)."""
    name: str
    nonce: str = ""
    canary: int = 0
    farm: int = 0
    data: str = ""


def parse_red_team_spec(spec: str) -> RedTeamSpec:
    """The parts of ``redteam:WHAT:NAME[?...]``; AgentSpecError for anything else."""
    body, _, query = spec.strip().removeprefix(RED_TEAM_PREFIX).partition("?")
    what, _, name = body.partition(":")
    if what not in ("exploit", "escape", "canary") or not _RED_TEAM_NAME.fullmatch(name):
        raise AgentSpecError(f"{_shown(spec)}: a red-team spec is redteam:exploit:NAME, redteam:escape:NAME or "
                             "redteam:canary:NAME")
    options: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key in options or key not in ("nonce", "canary", "farm", "data"):
            raise AgentSpecError(f"{_shown(spec)}: a red-team spec takes nonce, canary, farm and data, once each")
        if key == "nonce" and not _HEX.fullmatch(value):
            raise AgentSpecError(f"{_shown(spec)}: nonce is 16 to 64 lower-case hex digits")
        if key in ("canary", "farm"):
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise AgentSpecError(f"{_shown(spec)}: {key} is a port, 1 to 65535")
            options[key] = int(value)
            continue
        if key == "data" and not (value.startswith("/") and value.isprintable() and len(value) <= 200):
            raise AgentSpecError(f"{_shown(spec)}: data is an absolute path of at most 200 characters")
        options[key] = value
    return RedTeamSpec(what, name, **options)


@dataclass(frozen=True, kw_only=True)
class NamedEndpoint(RequestSettings):
    """An OpenAI-compatible server the operator named in farm.toml (``[endpoints.NAME]``): what its requests
    ask for and how they are retried are ``RequestSettings``, shared with ``EndpointConfig``."""

    name: str
    """What a spec calls it: ``openai:MODEL@NAME``."""
    url: str | tuple[str, ...]
    """The API's base, e.g. ``http://127.0.0.1:8000/v1``; or a list of them, servers of one model (replicas):
    each request goes to the one with the fewest outstanding. Read back as ``urls``; ``url`` is then the first."""
    key_env: str | None = None
    max_tokens: int = 16384
    """The most tokens per reply a spec may ask for."""
    max_turns: int = 50
    """The most replies in an action episode a spec may ask for (the task's own limit still applies)."""
    serves: str | None = None
    """The farm policy line whose weights this endpoint's ``policy_model`` has: farmd loads each version the line
    publishes into every replica (``sync``) and stamps each trajectory of that model with the version the server
    said it had when it sampled, read back from it. None: the endpoint serves models farm never saw, and their
    trajectories record no version (0)."""
    policy_model: str | None = None
    """The served model name of the line's policy (vLLM's ``--served-model-name``); default the line's name.
    Any other model on the same server records version 0."""
    sync: str = "reload"
    """How each version reaches the servers: ``reload`` (farmd writes its weights under ``weights_dir`` and asks
    every replica to reload them: vLLM with ``VLLM_SERVER_DEV_MODE=1``), or ``none`` (someone else loads them and
    sets the label ``LINE:VERSION`` with ``/update_weight_version``; farmd only reads it back)."""
    weights_dir: str | None = None
    """Where farmd writes each version's weights for the servers to read (a directory they see at the same path:
    a shared filesystem on a cluster). None: ``DATA/weights``."""
    health_path: str = "/health"
    health_every_s: float = 1.0
    health_timeout_s: float = 2.0
    health_failures: int = 2
    """A replica is taken out after this many health checks in a row without an answer below 500."""
    max_in_flight: int = 64
    """Jobs of this endpoint a worker runs at once. They hold no rollout slot (a model's reply is waited on, not
    computed): the cap is what keeps a hung server from holding more than this of a node's work."""

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url,) if isinstance(self.url, str) else tuple(self.url)

    @property
    def health(self) -> HealthConfig:
        return HealthConfig(path=self.health_path, every_s=self.health_every_s, timeout_s=self.health_timeout_s,
                            failures=self.health_failures)

    @property
    def served_policy(self) -> str | None:
        """The model name whose requests are the line's policy (None when the endpoint serves no line)."""
        return None if self.serves is None else (self.policy_model or self.serves)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _ENDPOINT_NAME.fullmatch(self.name):
            raise ValueError(f"the endpoint name {self.name!r} must be letters, digits, '.', '_' or '-' "
                             "(64 at most, starting with a letter or digit)")
        if isinstance(self.url, list | tuple):
            if not self.url or len(self.url) > 64 or not all(isinstance(u, str) for u in self.url):
                raise ValueError(f"url must be a string or a list of 1 to 64 strings, got {self.url!r}")
            if len(set(self.url)) < len(self.url):
                raise ValueError("url lists a server twice")
            object.__setattr__(self, "url", tuple(self.url))
        elif not isinstance(self.url, str):
            raise ValueError(f"url must be a string or a list of strings, got {self.url!r}")
        if self.sync not in ("reload", "none"):
            raise ValueError(f"sync is 'reload' or 'none', got {self.sync!r}")
        if self.policy_model is not None and (not isinstance(self.policy_model, str) or not self.policy_model
                                              or not self.policy_model.isprintable()):
            raise ValueError(f"policy_model must be a model name, got {self.policy_model!r}")
        if self.weights_dir is not None and (not isinstance(self.weights_dir, str)
                                             or not self.weights_dir.startswith("/")):
            raise ValueError(f"weights_dir must be an absolute path, got {self.weights_dir!r}")
        if not isinstance(self.max_in_flight, int) or isinstance(self.max_in_flight, bool) \
                or not 1 <= self.max_in_flight <= 100_000:
            raise ValueError(f"max_in_flight must be an integer from 1 to 100000, got {self.max_in_flight!r}")
        self.health  # noqa: B018 -- raises ValueError for a bad health setting
        if not _number(self.request_timeout_s) or self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be a positive number of seconds, got {self.request_timeout_s!r}")
        for name in ("max_attempts", "max_tokens", "max_turns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("logprobs", "token_ids", "tools"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.stop, str) or not isinstance(self.stop, list | tuple):
            raise ValueError(f"stop must be a list of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))  # TOML gives a list; the config is frozen
        if _number(self.temperature) and not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature!r}")
        if self.serves is not None and (not isinstance(self.serves, str)
                                        or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.serves)):
            raise ValueError(f"serves names a policy line (letters, digits, '.', '_' or '-'), got {self.serves!r}")
        check_sampling(temperature=self.temperature, top_p=self.top_p, seed=self.seed, stop=self.stop, n=self.n,
                       extra=self.extra)
        self.config("model")  # the URL, the key and the retry settings, checked as a request will use them

    def config(self, model: str, temperature: float | None = None) -> EndpointConfig:
        """A request's settings: this endpoint's, for ``model``, at ``temperature`` (default the endpoint's)."""
        shared = {name: getattr(self, name) for name in REQUEST_SETTINGS}
        shared.update(temperature=self.temperature if temperature is None else temperature, extra=dict(self.extra),
                      request_timeout_s=float(self.request_timeout_s))
        first, *others = self.urls
        return EndpointConfig(base_url=first, replicas=tuple(others), health=self.health, serves=self.serves,
                              policy_model=self.served_policy, model=model, **shared)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def make_agent(spec: str, *, endpoints: Sequence[NamedEndpoint] = (), clients: ClientPool | None = None,
               policies: PolicySource | None = None, torch: TorchRuntime | None = None,
               envs: EnvLookup | None = None, ctx: VerifyContext | None = None,
               red_team: RedTeamFactory | None = None) -> Agent:
    """The agent ``spec`` names; AgentSpecError (saying what would be accepted) for anything else.

    ``endpoints`` are the config's: the only servers an ``openai:`` spec may name. ``clients``: where an
    ``openai:`` agent takes its endpoint's client from (its owner closes them); without, the agent has its
    own and must be closed (``Agent.aclose``) once it has been used. ``torch``: the runtime (torch thread,
    loaded models) a ``torch:`` agent shares with the node's others (its owner closes it); without, a
    ``torch:`` agent has a runtime of its own over ``policies`` and must be closed likewise. ``envs`` and
    ``ctx``: where ``reference`` and ``skilled:`` find a task's environment (default: the built-ins) and the
    boxes its reference may need (a contributed environment's; without, only built-ins are answered).
    ``red_team``: what builds ``redteam:`` agents (without, this node refuses them).
    """
    if len(spec) > MAX_SPEC_CHARS:  # as given, blanks too: that is what a job stores with every trajectory
        raise AgentSpecError(f"{_shown(spec)}: an agent spec is at most {MAX_SPEC_CHARS} characters")
    spec = spec.strip()
    if not spec.isprintable():
        # Specs are stored with every job and shown to operators: no control or invisible characters.
        raise AgentSpecError(f"{_shown(spec)}: an agent spec must be printable text")
    if spec == "reference":
        return ReferenceAgent(envs, ctx)
    if spec == "random" or spec.startswith("random:"):
        return _random(spec)
    if spec.startswith("skilled:"):
        return _skilled(spec, envs, ctx)
    if spec.startswith("openai:"):
        return _openai(spec, {e.name: e for e in endpoints}, clients)
    if spec.startswith("torch:"):
        return _torch(spec, policies, torch)
    if spec.startswith(RED_TEAM_PREFIX):
        parse_red_team_spec(spec)
        if red_team is None:
            raise AgentSpecError(f"{_shown(spec)}: this node runs no red team")
        return red_team(spec, envs, ctx)
    raise AgentSpecError(f"unknown agent {_shown(spec)}; known forms: {', '.join(FORMS)}")


def check_spec(spec: str, *, endpoints: Sequence[NamedEndpoint] = ()) -> None:
    """Refuse (AgentSpecError) a spec no worker could run, where no agent runs: a config's ``demand_agent``,
    a run being queued. A ``torch:`` spec is checked by its form (the policy it names is the farm's
    business, not the spec's)."""
    if len(spec) <= MAX_SPEC_CHARS and spec.strip().startswith("torch:") and spec.strip().isprintable():
        parse_torch_spec(spec)
        return
    if len(spec) <= MAX_SPEC_CHARS and spec.strip().startswith(RED_TEAM_PREFIX) and spec.strip().isprintable():
        parse_red_team_spec(spec)  # built where it runs, by the node's red team
        return
    make_agent(spec, endpoints=endpoints)


def _shown(spec: str) -> str:
    """A spec quoted in an error: bounded, and ``repr`` makes any character visible."""
    return repr(clip(spec, 120)[0])


def _random(spec: str) -> Agent:
    _, _, seed = spec.partition(":")
    if not seed:
        return RandomAgent()
    try:
        return RandomAgent(int(seed))
    except ValueError:
        raise AgentSpecError(f"{_shown(spec)}: the seed of random:SEED must be an integer") from None


def _skilled(spec: str, envs: EnvLookup | None, ctx: VerifyContext | None) -> Agent:
    try:
        skill = float(spec.partition(":")[2])
    except ValueError:
        raise AgentSpecError(f"{_shown(spec)}: the skill of skilled:S must be a number, e.g. skilled:2.5") from None
    if not -100 <= skill <= 100:
        raise AgentSpecError(f"{_shown(spec)}: the skill must be between -100 and 100")
    return SkilledAgent(skill, envs, ctx)


def _configured(endpoints: Mapping[str, NamedEndpoint]) -> str:
    if not endpoints:
        return ('no model endpoints are configured: add [endpoints.NAME] with url = "http://HOST:PORT/v1" '
                "(and key_env, if it needs a key) to farmd's farm.toml")
    return f"configured: {', '.join(endpoints)}"


def _openai(spec: str, endpoints: Mapping[str, NamedEndpoint], clients: ClientPool | None) -> Agent:
    body = spec.removeprefix("openai:")
    if "://" in body:
        raise AgentSpecError(f"{_shown(spec)}: a URL in an agent spec is not accepted; model endpoints are named in "
                             f"farm.toml ([endpoints.NAME]) and a spec names one, openai:MODEL@NAME; "
                             f"{_configured(endpoints)}")
    model, at, rest = body.rpartition("@")
    if not at or not model:
        raise AgentSpecError(f"{_shown(spec)}: expected openai:MODEL@ENDPOINT, e.g. "
                             f"openai:Qwen/Qwen2.5-7B-Instruct@vllm; {_configured(endpoints)}")
    name, _, query = rest.partition("?")
    endpoint = endpoints.get(name)
    if endpoint is None:
        raise AgentSpecError(f"{_shown(spec)}: no endpoint named {name!r}; {_configured(endpoints)}")
    options = _options(spec, query, endpoint)
    temperature = _float(spec, options, "temperature", endpoint.temperature)
    if not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise AgentSpecError(f"{_shown(spec)}: temperature must be between 0 and {MAX_TEMPERATURE:g}")
    max_tokens = _int(spec, options, "max_tokens", min(ChatLimits().max_tokens, endpoint.max_tokens))
    if max_tokens > endpoint.max_tokens:
        raise AgentSpecError(f"{_shown(spec)}: max_tokens is at most {endpoint.max_tokens} on endpoint {name} "
                             "(its max_tokens in farm.toml)")
    max_turns = _int(spec, options, "max_turns", 0) or None
    if max_turns is not None and max_turns > endpoint.max_turns:
        raise AgentSpecError(f"{_shown(spec)}: max_turns is at most {endpoint.max_turns} on endpoint {name} "
                             "(its max_turns in farm.toml)")
    try:
        config = endpoint.config(model, temperature)
        agent = OpenAIAgent(config, limits=ChatLimits(max_tokens=max_tokens, max_turns=max_turns),
                            client=clients.client(name, config) if clients is not None else None)
    except ValueError as exc:
        raise AgentSpecError(f"{_shown(spec)}: {exc}") from None
    agent.name = f"openai:{model}@{name}"  # the endpoint's name, never its URL
    return agent


@dataclass(frozen=True)
class TorchSpec:
    """What a ``torch:NAME[?temperature=T&max_tokens=N]`` spec says."""

    name: str
    temperature: float = DEFAULT_TEMPERATURE
    max_tokens: int = DEFAULT_MAX_TOKENS


def parse_torch_spec(spec: str) -> TorchSpec:
    """A ``torch:`` spec's parts, checked (AgentSpecError), with no policy source needed: for checking a
    spec where no worker runs (a config's ``demand_agent``)."""
    spec = spec.strip()
    name, _, query = spec.removeprefix("torch:").partition("?")
    if not _POLICY_NAME.fullmatch(name):
        raise AgentSpecError(f"{_shown(spec)}: expected torch:NAME, NAME the policy line a trainer publishes to "
                             "(1-64 letters, digits, '.', '_' or '-', starting with a letter or digit), e.g. "
                             "torch:tiny; a path or a URL is not accepted: publish the policy to the farm "
                             "(FarmClient.publish_policy)")
    options = _query(spec, query)
    unknown = sorted(set(options) - set(_TORCH_OPTIONS))
    if unknown:
        raise AgentSpecError(f"{_shown(spec)}: unknown option(s) {', '.join(unknown)}; a torch spec may set "
                             f"{', '.join(_TORCH_OPTIONS)}, e.g. torch:{name}?temperature=0&max_tokens=8")
    temperature = _float(spec, options, "temperature", DEFAULT_TEMPERATURE)
    max_tokens = _int(spec, options, "max_tokens", DEFAULT_MAX_TOKENS)
    try:
        check_options(temperature, max_tokens)
    except ValueError as exc:
        raise AgentSpecError(f"{_shown(spec)}: {exc}") from None
    return TorchSpec(name, temperature, max_tokens)


def _torch(spec: str, policies: PolicySource | None, runtime: TorchRuntime | None) -> Agent:
    parsed = parse_torch_spec(spec)
    if runtime is not None:  # the worker's, shared with its other torch agents
        return TorchAgent(parsed.name, runtime, temperature=parsed.temperature, max_tokens=parsed.max_tokens)
    if policies is None:
        raise AgentSpecError(f"{_shown(spec)}: this node has no policy source to load torch policies from "
                             "(only a farmd worker has one)")
    return TorchAgent(parsed.name, TorchRuntime(policies), temperature=parsed.temperature,
                      max_tokens=parsed.max_tokens, owns_runtime=True)


def _query(spec: str, query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise AgentSpecError(f"{_shown(spec)}: a malformed query string: {exc}") from None
    options = dict(pairs)
    if len(options) < len(pairs):
        raise AgentSpecError(f"{_shown(spec)}: an option is given more than once")
    return options


def _options(spec: str, query: str, endpoint: NamedEndpoint) -> dict[str, str]:
    options = _query(spec, query)
    config_only = sorted(set(options) & set(_CONFIG_ONLY))
    if config_only:
        settings = ", ".join(_CONFIG_ONLY[k] for k in config_only)
        raise AgentSpecError(f"{_shown(spec)}: {', '.join(config_only)} cannot be set by a job; the operator sets "
                             f"{settings} in farm.toml's [endpoints.{endpoint.name}]")
    unknown = sorted(set(options) - set(_SPEC_OPTIONS))
    if unknown:
        raise AgentSpecError(f"{_shown(spec)}: unknown option(s) {', '.join(unknown)}; a spec may set "
                             f"{', '.join(_SPEC_OPTIONS)}")
    return options


def _int(spec: str, options: Mapping[str, str], name: str, default: int) -> int:
    if name not in options:
        return default
    try:
        value = int(options[name])
    except ValueError:
        raise AgentSpecError(f"{_shown(spec)}: {name}={options[name]!r} is not an integer") from None
    if value < 1:
        raise AgentSpecError(f"{_shown(spec)}: {name} must be positive")
    return value


def _float(spec: str, options: Mapping[str, str], name: str, default: float) -> float:
    if name not in options:
        return default
    try:
        value = float(options[name])
    except ValueError:
        raise AgentSpecError(f"{_shown(spec)}: {name}={options[name]!r} is not a number") from None
    if not math.isfinite(value):
        raise AgentSpecError(f"{_shown(spec)}: {name} must be a finite number")
    return value
