"""Agents by spec: the strings jobs and the CLI name a policy with.

- ``reference``: the environment's reference attempt (must pass).
- ``random`` or ``random:SEED``: a plausible wrong attempt, deterministic per task and seed.
- ``skilled:S``: a stand-in policy of skill S (a number; levels run 1..5): the reference with probability
  1 / (1 + e^(difficulty - S)), else a random attempt. A population for the task bank before a real policy.
- ``openai:MODEL@URL``: a model behind an OpenAI-compatible chat API whose base is URL, e.g.
  ``openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1``. A query string sets options:
  ``key_env=NAME`` (the API key's environment variable; default ``FARM_OPENAI_KEY``, and no key
  if that is unset), ``max_tokens``, ``temperature``, ``timeout_s``, ``attempts``, ``max_turns``.
  ``{version}`` in MODEL becomes the job's policy version.
- ``torch:PATH-OR-NAME``: a local torch policy (arrives in a later issue).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from farmd.agents.base import Agent
from farmd.agents.chat import ChatLimits
from farmd.agents.endpoint import EndpointConfig, OpenAIAgent
from farmd.agents.errors import AgentSpecError
from farmd.agents.scripted import RandomAgent, ReferenceAgent, SkilledAgent

DEFAULT_KEY_ENV = "FARM_OPENAI_KEY"
FORMS = ("reference", "random", "random:SEED", "skilled:S", "openai:MODEL@URL[?key_env=NAME&max_tokens=N&temperature=T"
         "&timeout_s=S&attempts=N&max_turns=N]", "torch:PATH-OR-NAME")

_OPENAI = re.compile(r"openai:(?P<model>.+?)@(?P<url>https?://.+)", re.DOTALL)


def make_agent(spec: str, *, environ: Mapping[str, str] | None = None) -> Agent:
    """The agent ``spec`` names; AgentSpecError (listing the known forms) for anything else.

    ``environ`` is where API keys are looked up (default: ``os.environ``, read now, not at import).
    """
    spec = spec.strip()
    if spec == "reference":
        return ReferenceAgent()
    if spec == "random" or spec.startswith("random:"):
        return _random(spec)
    if spec.startswith("skilled:"):
        return _skilled(spec)
    if spec.startswith("openai:"):
        return _openai(spec, os.environ if environ is None else environ)
    if spec.startswith("torch:"):
        raise AgentSpecError(f"{spec!r}: torch policies arrive in a later issue")
    raise AgentSpecError(f"unknown agent {spec!r}; known forms: {', '.join(FORMS)}")


def _random(spec: str) -> Agent:
    _, _, seed = spec.partition(":")
    if not seed:
        return RandomAgent()
    try:
        return RandomAgent(int(seed))
    except ValueError:
        raise AgentSpecError(f"{spec!r}: the seed of random:SEED must be an integer") from None


def _skilled(spec: str) -> Agent:
    try:
        skill = float(spec.partition(":")[2])
    except ValueError:
        raise AgentSpecError(f"{spec!r}: the skill of skilled:S must be a number, e.g. skilled:2.5") from None
    if not -100 <= skill <= 100:
        raise AgentSpecError(f"{spec!r}: the skill must be between -100 and 100")
    return SkilledAgent(skill)


def _int(spec: str, options: Mapping[str, str], name: str, default: int) -> int:
    if name not in options:
        return default
    try:
        return int(options[name])
    except ValueError:
        raise AgentSpecError(f"{spec!r}: {name}={options[name]!r} is not an integer") from None


def _float(spec: str, options: Mapping[str, str], name: str, default: float) -> float:
    if name not in options:
        return default
    try:
        return float(options[name])
    except ValueError:
        raise AgentSpecError(f"{spec!r}: {name}={options[name]!r} is not a number") from None


def _openai(spec: str, environ: Mapping[str, str]) -> Agent:
    m = _OPENAI.fullmatch(spec)
    if m is None:
        raise AgentSpecError(f"{spec!r}: expected openai:MODEL@http(s)://HOST[:PORT]/PATH, e.g. "
                             "openai:Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1")
    parts = urlsplit(m["url"])
    try:
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError as exc:
        raise AgentSpecError(f"{spec!r}: a malformed query string: {exc}") from None
    base_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    unknown = sorted(set(options) - {"key_env", "max_tokens", "temperature", "timeout_s", "attempts", "max_turns"})
    if unknown:
        raise AgentSpecError(f"{spec!r}: unknown option(s) {', '.join(unknown)}; known forms: {', '.join(FORMS)}")
    key_env = options.get("key_env", DEFAULT_KEY_ENV)
    api_key = environ.get(key_env) or None
    if "key_env" in options and api_key is None:
        raise AgentSpecError(f"{spec!r}: the environment variable {key_env} holds no API key")
    try:
        plain = EndpointConfig(base_url=base_url, model=m["model"], api_key=api_key)
        config = EndpointConfig(
            base_url=base_url, model=m["model"], api_key=api_key,
            temperature=_float(spec, options, "temperature", plain.temperature),
            request_timeout_s=_float(spec, options, "timeout_s", plain.request_timeout_s),
            max_attempts=_int(spec, options, "attempts", plain.max_attempts))
        limits = ChatLimits(max_tokens=_int(spec, options, "max_tokens", ChatLimits().max_tokens),
                            max_turns=_int(spec, options, "max_turns", 0) or None)
    except ValueError as exc:
        raise AgentSpecError(f"{spec!r}: {exc}") from None
    return OpenAIAgent(config, limits=limits)
